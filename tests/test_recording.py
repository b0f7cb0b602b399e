"""The notebook record: every call a valid cell built from the kernel's own messages, durable across crashes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import anyio
import nbformat
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from kernelexec.kernel.execution import Execution
from kernelexec.session.recording import Recorder, cell_record, rebuild_stale

from .conftest import Harness, clean_env, kernelexec_cmd
from .support import store_env

pytestmark = pytest.mark.anyio

PLOT = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 3, 2])\nplt.show()"


def stream(cell: nbformat.NotebookNode, name: str) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == name)


async def read_notebook(harness: Harness, handle: str) -> nbformat.NotebookNode:
    read = await harness.client.read_resource(f"kernelexec://sessions/{handle}/notebook.ipynb")
    nb = nbformat.reads(read.contents[0].text, as_version=4)
    nbformat.validate(nb)
    return nb


async def test_every_call_becomes_a_valid_cell_matching_its_answer(harness: Harness) -> None:
    s = await harness.new_session()
    calls = [
        ("x = 6\nprint('x is', x)", None),
        ("x * 7", None),
        ("raise ValueError('boom')", None),
        (PLOT, None),
        ("import time\nprint('before')\ntime.sleep(30)", 1),
    ]
    answers = [await harness.run(code, session=s, **({"timeout": t} if t else {})) for code, t in calls]
    nb = await read_notebook(harness, s)
    assert nb.metadata.kernelexec["session"] == s
    assert nbformat.reads(Path(answers[-1]["notebook"]).read_text(), as_version=4) == nb  # the resource is the file
    assert len(nb.cells) == len(calls)
    for cell, (code, timeout), answer in zip(nb.cells, calls, answers, strict=True):
        meta = cell.metadata.kernelexec
        assert cell.cell_type == "code" and cell.source == code
        assert cell.execution_count == answer["execution_count"]
        assert (meta["session"], meta["profile"], meta["layers"]) == (s, answer["profile"], answer["layers"])
        assert (meta["duration_ms"], meta["ending"], meta["timed_out"]) == (answer["duration_ms"], answer["ending"], answer["timed_out"])
        assert meta["timeout"] == (timeout or harness.settings.default_timeout)
        assert meta["kernel_restarted"] is False and meta["started"] <= meta["finished"]
        assert ("raises-exception" in cell.metadata.tags) is (not answer["success"])
        assert stream(cell, "stdout") == answer["stdout"] and stream(cell, "stderr") == answer["stderr"]
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert [e.ename for e in errors] == ([answer["error_type"]] if answer["error_type"] else [])
    assert nb.cells[1].outputs[0].output_type == "execute_result"
    assert nb.cells[1].outputs[0].data["text/plain"] == str(answers[1]["result"]) == "42"
    assert nb.cells[2].outputs[0].evalue == "boom"
    plot_mimes = {m for o in nb.cells[3].outputs if o.output_type == "display_data" for m in o.data}
    assert "image/png" in plot_mimes
    assert {o["mime_type"] for o in answers[3]["outputs"]} <= plot_mimes
    timed_out = nb.cells[4]
    assert timed_out.metadata.kernelexec["timed_out"] is True and timed_out.metadata.kernelexec["ending"] == "interrupted"
    assert stream(timed_out, "stdout") == "before\n"


async def test_kernel_death_and_restarts_are_in_the_record(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("import os\nos._exit(3)", session=s)
    await harness.call("restart_session", session=s)
    await harness.run("1 + 1", session=s)
    nb = await read_notebook(harness, s)
    died, marker, after = nb.cells
    assert died.metadata.kernelexec["kernel_restarted"] is True and died.metadata.kernelexec["ending"] == "kernel_died"
    assert died.outputs[-1].ename == "KernelexecError" and "exit code 3" in died.outputs[-1].evalue
    assert died.metadata.tags == ["raises-exception"]
    assert marker.cell_type == "markdown" and marker.metadata.kernelexec["event"] == "restart"
    assert "restart_session" in marker.source
    assert after.outputs[0].data["text/plain"] == "2"


async def test_a_cell_too_deep_for_an_ast_is_answered_and_recorded(harness: Harness) -> None:
    """``1+1+…`` 100,000 times: the record reads a cell's names from its syntax tree, which is too deep to build
    (RecursionError in the server). The cell is answered as the kernel ran it, and recorded, without names."""
    s = await harness.new_session()
    code = "x = " + "+".join(["1"] * 100_000)
    answer = await harness.run(code, session=s)
    assert "Error executing tool" not in json.dumps(answer)[:2000], json.dumps(answer)[:2000]
    nb = await read_notebook(harness, s)
    assert [c.source for c in nb.cells] == [code]
    assert "names" not in nb.cells[0].metadata.kernelexec


def _session_dir(base: Path, handle: str = "handle-1234") -> tuple[Path, Recorder]:
    session = base / "sessions" / handle
    session.mkdir(parents=True)
    (session / "session.json").write_text(json.dumps({"session": handle, "profile": "standard", "created": 0}))
    return session, Recorder(session / "journal.jsonl", session / "notebook.ipynb", {"session": handle})


def test_every_append_leaves_a_valid_notebook_and_a_torn_journal_line_is_skipped(tmp_path: Path) -> None:
    session, recorder = _session_dir(tmp_path)
    recorder.start()
    assert nbformat.read(session / "notebook.ipynb", as_version=4).cells == []  # exists before any cell
    ok = Execution(code="a = 1", execution_count=1, duration_ms=2.5)
    died = Execution(code="boom()", execution_count=2, ending="kernel_died", restart_reason="the kernel died")
    for step, (kind, item) in enumerate([("cell", ok), ("cell", died), ("mark", None)], 1):
        if kind == "cell":
            recorder.append(item, {"session": "handle-1234"})
        else:
            recorder.mark("restart", "kernel restarted")
        nb = nbformat.read(session / "notebook.ipynb", as_version=4)
        nbformat.validate(nb)
        assert len(nb.cells) == step  # current after every record, no debounce
    assert [c.cell_type for c in nb.cells] == ["code", "code", "markdown"]
    assert nb.cells[1].outputs == [nbformat.from_dict(cell_record(died, {})["outputs"][0])]
    with open(session / "journal.jsonl", "a") as fh:
        fh.write('{"cell_type": "code", "sour')  # the machine died mid-write
    rebuild_stale(tmp_path / "sessions")  # the journal is newer: rewritten, but the torn line is no cell
    assert [c.cell_type for c in nbformat.read(session / "notebook.ipynb", as_version=4).cells] == ["code", "code", "markdown"]
    assert rebuild_stale(tmp_path / "sessions") == []  # current now: nothing to do


def test_a_notebook_behind_or_torn_is_rebuilt_and_one_broken_directory_does_not_stop_the_rest(tmp_path: Path) -> None:
    behind, rec_behind = _session_dir(tmp_path, "behind-1234")
    torn, rec_torn = _session_dir(tmp_path, "torn-12345")
    broken, _ = _session_dir(tmp_path, "broken-1234")
    for rec in (rec_behind, rec_torn):
        rec.append(Execution(code="a = 1", execution_count=1), {})
    # killed between the journal's fsync and the notebook's append
    (behind / "journal.jsonl").open("a").write(json.dumps(cell_record(Execution(code="b = 2"), {})) + "\n")
    # killed in the middle of the notebook's append
    data = (torn / "notebook.ipynb").read_bytes()
    (torn / "notebook.ipynb").write_bytes(data[:-7])
    # a directory nothing can be made of: its journal is a directory, its notebook a file it cannot replace
    (broken / "journal.jsonl").mkdir()
    (broken / "notebook.ipynb").mkdir()
    written = rebuild_stale(tmp_path / "sessions")
    assert sorted(written) == sorted([behind / "notebook.ipynb", torn / "notebook.ipynb"])
    assert [c.source for c in nbformat.read(behind / "notebook.ipynb", as_version=4).cells] == ["a = 1", "b = 2"]
    assert [c.source for c in nbformat.read(torn / "notebook.ipynb", as_version=4).cells] == ["a = 1"]
    assert rebuild_stale(tmp_path / "sessions") == []  # up to date now


def _written() -> int:
    """Bytes this process has handed to write(2) so far (/proc/self/io ``wchar``)."""
    return int(next(line.split()[1] for line in open("/proc/self/io") if line.startswith("wchar:")))


def test_recording_cost_does_not_grow_with_the_notebook(tmp_path: Path) -> None:
    """Each append writes its line at the end: the bytes written for cell 10 and cell 2,000 are alike
    (a rewrite of the notebook would write all of it every time)."""
    session, recorder = _session_dir(tmp_path)
    recorder.start()
    cost = []
    for n in range(2000):
        before = _written()
        recorder.append(Execution(code=f"x = {n:04d}", execution_count=n + 1), {"session": "handle-1234"})
        cost.append(_written() - before)
    assert (session / "notebook.ipynb").stat().st_size > 100 * cost[10]
    assert cost[1999] < 1.2 * cost[10]
    assert len(nbformat.read(session / "notebook.ipynb", as_version=4).cells) == 2000


# --- a server killed mid-session -------------------------------------------------------------------
def stdio_params(state: Path, store: dict[str, str]) -> StdioServerParameters:
    """``kernelexec serve`` on ``state``, its session store the run's (``store_env()``, one for every server on it)."""
    cmd = kernelexec_cmd("serve", "--state-dir", str(state))
    return StdioServerParameters(command=cmd[0], args=cmd[1:], env=clean_env(**store))


def server_pid(state: Path) -> int:
    """The pid of the `kernelexec serve` the test started for ``state`` (its command line names it)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and str(state).encode() in argv:
            return int(entry.name)
    raise LookupError(f"no kernelexec serve for {state}")


async def wait_until(predicate, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await anyio.sleep(0.05)


@pytest.mark.slow
async def test_a_killed_server_loses_only_the_cell_in_flight_and_its_session_comes_back(short_tmp: Path) -> None:
    state, store = short_tmp / "killed", store_env()
    async with Client(stdio_params(state, store)) as client:
        first = await client.call_tool("execute_code", {"code": "x = 20"})
        handle = first.structured_content["session"]
        await client.call_tool("execute_code", {"code": "1 / 0", "session": handle})
        await client.call_tool("execute_code", {"code": "y = x + 1", "session": handle})
        session_dir = Path(first.structured_content["notebook"]).parent
        started = session_dir / "work" / "started"

        def y_saved() -> bool:  # the background save of y done (a cell starting at once would put it off)
            try:
                manifest = json.loads((session_dir / "checkpoint" / "manifest.json").read_text())
            except (OSError, ValueError):
                return False
            return "y" in manifest.get("vars", {})

        await wait_until(y_saved)

        async def in_flight() -> None:
            code = "open('started', 'w').close()\nimport time\ntime.sleep(60)\nlost = True"
            with pytest.raises(MCPError, match="Connection closed"):
                await client.call_tool("execute_code", {"code": code, "session": handle})

        async with anyio.create_task_group() as tg:
            tg.start_soon(in_flight)
            await wait_until(started.exists)
            os.kill(server_pid(state), signal.SIGKILL)
    journal = [json.loads(line) for line in (session_dir / "journal.jsonl").read_text().splitlines()]
    assert [c["source"] for c in journal] == ["x = 20", "1 / 0", "y = x + 1"]
    # with no server running: the notebook the answers named already holds every answered cell
    nb = nbformat.read(session_dir / "notebook.ipynb", as_version=4)
    nbformat.validate(nb)
    assert [c.source for c in nb.cells] == ["x = 20", "1 / 0", "y = x + 1"]

    async with Client(stdio_params(state, store)) as client:
        await client.list_tools()  # the server is up; the notebook is still the same
        nb = nbformat.read(session_dir / "notebook.ipynb", as_version=4)
        nbformat.validate(nb)
        assert [c.source for c in nb.cells] == ["x = 20", "1 / 0", "y = x + 1"]
        again = await client.call_tool("execute_code", {"code": "x + y", "session": handle})
        answer = again.structured_content
        assert answer["result"] == 41 and answer["session"] == handle
        assert "revived after a server restart" in answer["restart_reason"]
        assert "restored x, y from the checkpoint" in answer["restart_reason"]  # loaded, not rerun (issue 32)
        lost = await client.call_tool("execute_code", {"code": "'lost' in dir()", "session": handle})
        assert lost.structured_content["result"] is False
