"""Replay (``kernelexec replay``), restore (``restart_session(replay=True)``) and revival after a server restart."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from kernelexec.session.compare import comparable, differences, normalise
from kernelexec.session.restore import restorable

from .conftest import Harness, clean_env, kernelexec_cmd, make_settings, start_harness
from .support import build_wheel, package_index

pytestmark = pytest.mark.anyio

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def replay(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(kernelexec_cmd("replay", *map(str, args)), capture_output=True, text=True, timeout=240, env=clean_env())


# --- pure parts --------------------------------------------------------------------------------
def test_normalise_hides_addresses_uuids_timings_dates_and_the_session_directory() -> None:
    text = ("<Foo at 0x7f3a2b1c9d80> id=123e4567-e89b-12d3-a456-426614174000 "
            "Wall time: 1.52 ms; 3.1 µs ± 20.5 ns per loop (mean ± std. dev. of 7 runs, 100,000 loops each) "
            "took 0.25 s at 2026-11-29T16:34:54.826 in /tmp/x/sessions/abc/work; 3 apples")
    assert normalise(text, ["/tmp/x/sessions/abc"]) == (
        "<Foo at 0x…> id=<uuid> Wall time: <time>; <timeit> took <time> at <datetime> in <session>/work; 3 apples")


def test_comparable_joins_streams_keeps_errors_short_and_images_by_kind() -> None:
    outputs = [
        {"output_type": "stream", "name": "stdout", "text": "a"},
        {"output_type": "display_data", "data": {"image/png": "iVBOR...", "text/plain": "<Figure at 0x1234abcd>"}},
        {"output_type": "stream", "name": "stdout", "text": "b"},
        {"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": ["...Cell In[7]..."]},
        {"output_type": "error", "ename": "KernelexecError", "evalue": "timed out", "traceback": []},
    ]
    assert comparable(outputs) == {
        "stdout": "ab", "stderr": "", "errors": ["KeyboardInterrupt: "],
        "outputs": ["display_data image/png | text/plain: <Figure at 0x…>"],
    }


def test_a_flood_cut_in_the_record_matches_on_its_head_and_tail() -> None:
    recorded = {"stdout": "head\n[... 5,000 characters cut in the record; the answer's stdout_file has them ...]\ntail"}
    assert differences(recorded, {"stdout": "head" + "x" * 5000 + "tail"}) == []
    assert differences(recorded, {"stdout": "head" + "x" * 5000 + "tall"}) != []


def test_restorable_takes_successful_cells_since_the_last_plain_restart() -> None:
    def code(source: str, success: bool) -> dict:
        return {"cell_type": "code", "source": source, "metadata": {"kernelexec": {"success": success}}}

    def marker(event: str) -> dict:
        return {"cell_type": "markdown", "source": "", "metadata": {"kernelexec": {"event": event}}}

    cells = [code("a", True), marker("restart"), code("b", True), code("c", False), marker("restore"),
             code("d", True), marker("revive"), code("e", True)]
    assert [(n, c["source"]) for n, c in restorable(cells)] == [(3, "b"), (6, "d"), (8, "e")]


# --- restore -----------------------------------------------------------------------------------
def kill_kernel(harness: Harness, handle: str) -> None:
    os.kill(harness.sessions.sessions[handle].kernel.km.provisioner.process.pid, signal.SIGKILL)


async def test_restore_after_a_kernel_kill_brings_variables_back_and_lists_what_ran(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("a = 1", session=s)
    await harness.run("b = a + 1\nprint('side effect')", session=s)
    await harness.run("raise ValueError('not replayed')", session=s)
    await harness.run("c = b * 10", session=s)
    kill_kernel(harness, s)
    info = (await harness.call("restart_session", session=s, replay=True)).structured_content
    assert [(r["cell"], r["first_line"], r["ok"]) for r in info["replayed"]] == [
        (1, "a = 1", True), (2, "b = a + 1", True), (4, "c = b * 10", True)]
    assert info["detail"] == "replayed 3 cells (1, 2, 4)"
    assert (await harness.run("a, b, c", session=s))["result"] == [1, 2, 20]


async def test_restore_starts_after_a_plain_restart_and_reports_cells_that_fail_now(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("gone = 'cleared by the plain restart'", session=s)
    await harness.call("restart_session", session=s)
    work = Path((await harness.run("import os\nos.getcwd()", session=s))["result"])
    (work / "data.txt").write_text("42")
    await harness.run("data = open('data.txt').read()", session=s)
    await harness.run("kept = 'yes'", session=s)
    (work / "data.txt").unlink()
    info = (await harness.call("restart_session", session=s, replay=True)).structured_content
    assert [r["first_line"] for r in info["replayed"]] == ["import os", "data = open('data.txt').read()", "kept = 'yes'"]
    failed = [r for r in info["replayed"] if not r["ok"]]
    assert len(failed) == 1 and failed[0]["error"].startswith("FileNotFoundError")
    assert "failed this time: cell 4: FileNotFoundError" in info["detail"]
    r = await harness.run("kept, 'gone' in dir(), 'data' in dir()", session=s)
    assert r["result"] == ["yes", False, False]


async def test_a_server_stopped_just_after_a_cell_keeps_that_cells_checkpoint(short_tmp: Path) -> None:
    """A deploy: the server stops (gracefully) the moment a call was answered, while the kernel still saves that
    cell's variables (a save starts once the answer is out). The stop waits for the save, so the revived session
    loads them; before, the kernel was killed mid-save and the cell was run again (side effects twice)."""
    settings = make_settings(short_tmp, pool_size=0)
    first, cm = await start_harness(settings)
    try:
        kept = await first.new_session()
        await first.run("blob = list(range(10_000_000))\nruns = len(open('ran', 'a').write('x') * [0])", session=kept)  # ~1 s to save
    finally:
        await first.client.__aexit__(None, None, None)
        await cm.__aexit__(None, None, None)
    second, cm = await start_harness(settings)
    try:
        r = await second.run("len(blob), open('ran').read()", session=kept)
        assert r["result"] == [10_000_000, "x"], r  # loaded, not run again (it would have appended a second x)
        assert "restored blob, runs from the checkpoint" in r["restart_reason"], r
    finally:
        await second.client.__aexit__(None, None, None)
        await cm.__aexit__(None, None, None)


@pytest.mark.slow
async def test_kernels_that_never_confirm_their_saves_hold_a_stopping_server_10_s_together_not_in_turn(short_tmp: Path) -> None:
    """The wait for the last saves is bounded (SAVES_WAIT) and taken by every kernel at once: three kernels whose
    checkpoint status never answers (rebound to sleep by their cells) stop the server in ~10 s (then their shutdown), not 30 and more, or forever."""
    settings = make_settings(short_tmp, pool_size=0)
    first, cm = await start_harness(settings)
    try:
        for _ in range(3):
            s = await first.new_session()
            r = await first.run("import time\nx = 1\n_kernelexec_checkpoint_status = lambda: time.sleep(600)", session=s)
            assert r["success"], r
    finally:
        await first.client.__aexit__(None, None, None)
        began = time.monotonic()
        await cm.__aexit__(None, None, None)
        took = time.monotonic() - began
    assert 9 < took < 25, f"the server took {took:.1f} s to stop"  # ~10 s, then the kernels stopped; in turn, 30 and more


async def test_a_handle_outlives_its_server_and_a_closed_one_does_not(short_tmp: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0)
    first, cm = await start_harness(settings)
    try:
        kept = await first.new_session()
        await first.run("x = 5", session=kept)
        await first.run("y = x + 1", session=kept)
        closed = await first.new_session()
        await first.call("close_session", session=closed)
    finally:
        await first.client.__aexit__(None, None, None)
        await cm.__aexit__(None, None, None)
    second, cm = await start_harness(settings)
    try:
        notebook = await second.client.read_resource(f"kernelexec://sessions/{kept}/notebook.ipynb")
        assert len(nbformat.reads(notebook.contents[0].text, as_version=4).cells) == 2
        r = await second.run("x * y", session=kept)
        assert r["result"] == 30 and r["session"] == kept
        assert r["restart_reason"] == "session revived after a server restart in a new kernel; restored x, y from the checkpoint"
        assert (await second.run("x", session=kept))["restart_reason"] is None  # said once
        gone = await second.call("execute_code", code="1", session=closed)
        assert gone.is_error and "unknown session" in gone.content[0].text
    finally:
        await second.client.__aexit__(None, None, None)
        await cm.__aexit__(None, None, None)


# --- kernelexec replay -------------------------------------------------------------------------
@pytest.fixture(scope="module")
async def recorded(harness: Harness, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session with a print of an address, an error, a plot, a timeout, a restart and a restore."""
    s = await harness.new_session()
    await harness.run("class Box:\n    pass\n\nbox = Box()\nprint('made', box)", session=s)
    await harness.run("words = ['kernel', 'exec']\nlen(words)", session=s)
    await harness.run("words[5]", session=s)
    await harness.run("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([3, 1, 2])\nfig", session=s)
    await harness.run("import time\ntime.sleep(30)", session=s, timeout=1)
    await harness.call("restart_session", session=s)
    await harness.run("base = 7", session=s)
    await harness.call("restart_session", session=s, replay=True)
    r = await harness.run("import sys\nprint(base * 6, file=sys.stderr)\n{'base': base}", session=s)
    return Path(r["notebook"]).parent


@pytest.mark.slow
async def test_replay_reproduces_a_recorded_session(recorded: Path, tmp_path: Path) -> None:
    session = tmp_path / "session"
    shutil.copytree(recorded, session, ignore=shutil.ignore_patterns("k-*", "kernel.json", ".lock"))
    (session / "notebook.ipynb").unlink(missing_ok=True)  # as a killed server may leave it: rebuilt from the journal
    out = tmp_path / "replayed.ipynb"
    proc = replay(session, "--output", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rebuilt from its journal" in proc.stdout
    assert "7 cells: 7 same, 0 different" in proc.stdout
    assert "[interrupted live, interrupted on replay]" in proc.stdout
    nb = nbformat.read(out, as_version=4)
    nbformat.validate(nb)
    last = nb.cells[-1]
    assert last.outputs[0].text == "42\n" and last.outputs[1].data["text/plain"] == "{'base': 7}"


@pytest.mark.slow
async def test_replay_detects_a_changed_output_and_names_the_cell(recorded: Path, tmp_path: Path) -> None:
    (recorded / "notebook.ipynb").unlink(missing_ok=True)
    nb = nbformat.read(replay_source(recorded), as_version=4)
    nb.cells[1].outputs[0].data["text/plain"] = "3"  # len(words) was 2
    edited = tmp_path / "edited.ipynb"
    nbformat.write(nb, edited)
    proc = replay(edited)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "cell 2    DIFFERENT words = ['kernel', 'exec']" in proc.stdout
    assert "outputs #1: recorded 'execute_result text/plain: 3'" in proc.stdout
    assert "#1: replayed 'execute_result text/plain: 2'" in proc.stdout
    assert proc.stdout.rstrip().endswith("7 cells: 6 same, 1 different (cell 2)")


def replay_source(session: Path) -> Path:
    from kernelexec.session.replay_cli import load_notebook

    return load_notebook(session)[1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["quickstart.ipynb", "recorded-session.ipynb"])
def test_the_shipped_notebooks_replay_cleanly(name: str, tmp_path: Path) -> None:
    shutil.copy(NOTEBOOKS / name, tmp_path / name)  # replay runs in the notebook's folder: not the checkout's
    proc = replay(tmp_path / name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 different" in proc.stdout


async def test_a_notebook_never_chooses_its_profile_or_lifts_the_timeout_limit(
    tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The attack: a foreign notebook says it was recorded under `trusted` (subprocess and network
    allowed) with a cell timeout of 1e9 s on an endless loop. Replay runs it under the user's profile,
    says the recorded one differs, and caps the timeout at --max-timeout."""
    from kernelexec.session.replay_cli import replay_command

    nb = nbformat.v4.new_notebook(metadata={"kernelexec": {"profile": "trusted", "session": "evil-handle"}})
    nb.cells.append(nbformat.v4.new_code_cell(
        "import subprocess\nsubprocess.run(['id'], capture_output=True).returncode",
        metadata={"kernelexec": {"timeout": 30, "ending": "completed", "success": True}}))
    nb.cells.append(nbformat.v4.new_code_cell(
        "while True:\n    pass", metadata={"kernelexec": {"timeout": 1e9, "ending": "completed", "success": True}}))
    foreign, ran = tmp_path / "foreign.ipynb", tmp_path / "ran.ipynb"
    nbformat.write(nb, foreign)
    settings = make_settings(short_tmp, max_timeout=2, interrupt_grace=1)
    assert settings.effective_profile == "standard"
    assert await replay_command(settings, str(foreign), output=str(ran), profile=None) == 1
    out = capsys.readouterr().out
    assert "profile standard" in out.splitlines()[0]
    assert "note: recorded under profile 'trusted'; replayed under standard" in out
    assert "cell 1, 2: recorded timeout above --max-timeout (2 s); capped" in out
    cells = nbformat.read(ran, as_version=4).cells
    assert "not allowed" in cells[0].outputs[0].evalue  # no subprocess under standard
    assert cells[1].metadata.kernelexec["replay_ending"] == "interrupted"  # stopped at 2 s, not 1e9


async def test_replay_takes_the_profile_from_flags_not_from_the_notebook(
    tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kernelexec.session.replay_cli import replay_command

    nb = nbformat.v4.new_notebook(metadata={"kernelexec": {"profile": "strict"}})
    nb.cells.append(nbformat.v4.new_code_cell("import os", metadata={"tags": ["raises-exception"]}))
    fresh = tmp_path / "fresh.ipynb"
    nbformat.write(nb, fresh)
    settings = make_settings(short_tmp)
    assert await replay_command(settings, str(fresh), output=None, profile=None) == 0
    out = capsys.readouterr().out
    assert "profile standard" in out and "recorded under profile 'strict'" in out
    assert await replay_command(settings, str(fresh), output=str(tmp_path / "s.ipynb"), profile="strict") == 0
    ran = nbformat.read(tmp_path / "s.ipynb", as_version=4)
    assert "not allowed in the 'strict' profile" in ran.cells[0].outputs[0].evalue


# --- a foreign notebook never installs unasked ----------------------------------------------------
@pytest.fixture(scope="module")
def watched_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A real package index on 127.0.0.1 (tests/support.package_index) that logs every request it gets."""
    base = tmp_path_factory.mktemp("watched")
    files = [build_wheel(base / "wheels", "beacon_pkg", "1.0", "VALUE = 'beacon'\n"),
             build_wheel(base / "wheels", "kxdep", "0.1", "DEP = 'dep'\n")]
    log = base / "requests.log"
    with package_index(base / "root", files, log=log) as url:
        yield url, log


def evil_notebook(path: Path) -> Path:
    """A foreign notebook: an install marker naming kxdep, then a cell whose %pip line names beacon-pkg,
    then a cell that needs kxdep. Recorded outputs say what a run with both packages shows."""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell(
        "*kernelexec: install_packages: installed kxdep-0.1*",
        metadata={"kernelexec": {"event": "install", "specs": ["kxdep"]}}))
    beacon = nbformat.v4.new_code_cell("%pip install -q beacon-pkg\nimport beacon_pkg\nbeacon_pkg.VALUE", execution_count=1)
    beacon.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "'beacon'"}, execution_count=1)]
    nb.cells.append(beacon)
    dep = nbformat.v4.new_code_cell("import kxdep\nkxdep.DEP", execution_count=2)
    dep.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "'dep'"}, execution_count=2)]
    nb.cells.append(dep)
    nbformat.write(nb, path)
    return path


def requests_in(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if '"GET ' in line] if log.exists() else []


@pytest.mark.slow
def test_replay_of_a_foreign_notebook_asks_the_index_nothing_unless_told_to_install(
    watched_index: tuple[str, Path], tmp_path: Path, short_tmp: Path
) -> None:
    """The attack: `%pip install beacon-pkg` and an install marker in a notebook someone sent. Replayed
    without --install, the user's index hears nothing (no beacon, no dependency-confusion lever): the
    installs are listed, the %pip cell is skipped with a note, and the cell that needed the other
    package fails as usual. --install stays within --install-policy (off: still nothing asked). With
    --install, both are installed and the replay matches."""
    url, log = watched_index
    evil = evil_notebook(tmp_path / "evil.ipynb")
    out = tmp_path / "replayed.ipynb"
    env = clean_env(PIP_CONFIG_FILE=os.devnull)
    common = ["--state-dir", str(short_tmp / "evil"), "--index-url", url, "--pool-size", "0", "--restart-spares", "0"]
    log.write_text("")
    plain = subprocess.run(kernelexec_cmd("replay", *common, "-o", str(out), str(evil)),
                           capture_output=True, text=True, timeout=240, env=env)
    assert plain.stdout.startswith("replaying"), plain.stdout + plain.stderr
    assert requests_in(log) == [], (requests_in(log), plain.stdout + plain.stderr)
    assert plain.returncode == 1 and "Traceback" not in plain.stderr, plain.stdout + plain.stderr
    listed = [line for line in plain.stdout.splitlines() if line.startswith("installs recorded")]
    assert len(listed) == 1 and "kxdep" in listed[0] and "beacon-pkg" in listed[0] and "--install" in listed[0], plain.stdout
    assert "cell 2    skipped" in plain.stdout and "--install" in plain.stdout
    failed = [line for line in plain.stdout.splitlines() if "errors #1: replayed" in line]  # cell 3, as usual
    assert len(failed) == 1 and "Error" in failed[0] and "Import of kxdep" in failed[0], plain.stdout
    assert "cell 3    DIFFERENT import kxdep" in plain.stdout
    report = nbformat.read(out, as_version=4)
    assert report.metadata.kernelexec["replay"]["installs"] == {
        "redone": False, "recorded": [{"cell": 1, "via": "install_packages", "specs": ["kxdep"]},
                                      {"cell": 2, "via": "pip", "specs": ["beacon-pkg"]}]}
    assert report.cells[1].metadata.kernelexec["replay_ending"] == "skipped"

    refused = subprocess.run(kernelexec_cmd("replay", *common, "--install", "--install-policy", "off", str(evil)),
                             capture_output=True, text=True, timeout=240, env=env)  # --install stays within the policy
    assert requests_in(log) == [], (requests_in(log), refused.stdout + refused.stderr)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stdout + refused.stderr
    assert "--install, but --install-policy off" in refused.stdout and "--install-policy off" in refused.stderr, refused.stderr

    told = subprocess.run(kernelexec_cmd("replay", *common, "--install", str(evil)),
                          capture_output=True, text=True, timeout=240, env=env)
    assert told.returncode == 0, told.stdout + told.stderr
    assert "2 cells: 2 same, 0 different" in told.stdout, told.stdout
    asked = " ".join(requests_in(log))
    assert "/simple/kxdep/" in asked and "/simple/beacon-pkg/" in asked, asked


def test_replay_runs_in_the_notebooks_folder_by_default_and_in_working_dir_when_given(tmp_path: Path, short_tmp: Path) -> None:
    """As nbclient and papermill do: a notebook that reads the file beside it replays as recorded."""
    import nbformat

    folder = tmp_path / "analysis"
    folder.mkdir()
    (folder / "data.txt").write_text("beside the notebook")
    cell = nbformat.v4.new_code_cell("open('data.txt').read()", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "'beside the notebook'"}, execution_count=1)]
    nb_path = folder / "read.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), nb_path)
    env = clean_env()
    here = subprocess.run(kernelexec_cmd("replay", str(nb_path), "--state-dir", str(short_tmp / "rf1")),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert here.returncode == 0, (here.stdout, here.stderr)
    assert f"in {folder}" in here.stdout and "1 same" in here.stdout, here.stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    there = subprocess.run(kernelexec_cmd("replay", str(nb_path), "--working-dir", str(elsewhere), "--state-dir", str(short_tmp / "rf2")),
                           capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert there.returncode == 1 and "FileNotFoundError" in there.stdout, (there.stdout, there.stderr)


async def test_a_jupyter_notebook_matches_after_display_updates_micro_signs_and_hex_ids(
        tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What nbclient would call the same: a later update_display rewrote an earlier cell (the recorded
    notebook holds its final state), either micro sign, uuid4().hex ids; a foreign notebook's cells have no
    recorded ending; a differing cell's console line names its error."""
    from kernelexec.session.replay_cli import replay_command

    def cell(source: str, outputs: list[dict]) -> nbformat.NotebookNode:
        c = nbformat.v4.new_code_cell(source, execution_count=1)
        c.outputs = [nbformat.from_dict(o) for o in outputs]
        return c

    nb = nbformat.v4.new_notebook(cells=[
        cell("h = display('first', display_id=True)", [
            {"output_type": "display_data", "data": {"text/plain": "'second'"}, "metadata": {}}]),
        cell("h.update('second')", []),
        cell("print('3.1 \\u00b5s per call'); print(__import__('uuid').uuid4().hex)", [
            {"output_type": "stream", "name": "stdout", "text": "3.1 \u03bcs per call\n0123456789abcdef0123456789abcdef\n"}]),
        cell("undefined_name", [{"output_type": "execute_result", "data": {"text/plain": "1"}, "metadata": {}, "execution_count": 1}]),
    ])
    path = tmp_path / "jupyter.ipynb"
    nbformat.write(nb, path)
    code = await replay_command(make_settings(short_tmp), str(path), output=None, profile=None)
    out = capsys.readouterr().out
    assert code == 1, out
    assert "4 cells: 3 same, 1 different (cell 4)" in out, out
    assert "raised NameError: name 'undefined_name' is not defined" in out, out
    assert "after a later cell's display update" in out and "[unknown live" not in out, out


async def test_a_notebook_nbclient_ran_replays_as_matching(tmp_path: Path, short_tmp: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Jupyter's own run as the record: nbclient executes a notebook (a plot, %timeit, a file beside it, a
    display a later cell updates) in a plain ipykernel; kernelexec replay of that notebook says every cell
    matches (PNG figures as Jupyter makes them, timings and micro signs normalised, final display state)."""
    from nbclient import NotebookClient

    from kernelexec.session.replay_cli import replay_command

    folder = tmp_path / "nbc"
    folder.mkdir()
    (folder / "numbers.csv").write_text("x\n1\n2\n3\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in [
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
        "%timeit sum(range(10))",
        "import csv\nwith open('numbers.csv') as f:\n    total = sum(int(r['x']) for r in csv.DictReader(f))\ntotal",
        "h = display('before', display_id=True)",
        "h.update('after')",
    ]], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    await NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).async_execute()
    assert [o["output_type"] for o in nb.cells[0].outputs] == ["display_data"]
    assert set(nb.cells[0].outputs[0]["data"]) == {"image/png", "text/plain"}  # Jupyter's default: PNG only
    path = folder / "ran.ipynb"
    nbformat.write(nb, path)
    code = await replay_command(make_settings(short_tmp), str(path), output=None, profile=None)
    out = capsys.readouterr().out
    assert code == 0 and "5 cells: 5 same, 0 different" in out, out


async def _nbclient_then_replay(folder: Path, short_tmp: Path, sources: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``sources`` with nbclient as Jupyter would (allow_errors), then kernelexec replay of what it wrote: the console."""
    from nbclient import NotebookClient

    from kernelexec.session.replay_cli import replay_command

    folder.mkdir(exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in sources],
                                  metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    await NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                         resources={"metadata": {"path": str(folder)}}).async_execute()
    path = folder / "ran.ipynb"
    nbformat.write(nb, path)
    code = await replay_command(make_settings(short_tmp), str(path), output=None, profile=None)
    out = capsys.readouterr().out
    return f"exit {code}\n{out}"


async def test_a_jupyter_notebooks_input_raises_what_it_raises_under_nbclient(
        tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cell kernelexec did not record has no answers and no one to ask: input() and %debug's prompt raise
    StdinNotImplementedError, as under nbclient (not EOFError, a question beyond a recorded cell's answers)."""
    out = await _nbclient_then_replay(tmp_path / "ask", short_tmp, [
        "name = input('name: ')",
        "try:\n    input('again: ')\nexcept Exception as e:\n    print(type(e).__name__)",
    ], capsys)
    assert out.startswith("exit 0") and "2 cells: 2 same, 0 different" in out, out


async def test_autoreload_in_a_jupyter_notebook_says_nothing_of_kernelexecs_own_modules(
        tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``%load_ext autoreload`` reads the source of every loaded module with a file: kernelexec's startup modules,
    which the guard does not let a cell read, printed a traceback each on stderr; replay now matches nbclient's run."""
    out = await _nbclient_then_replay(tmp_path / "ar", short_tmp, [
        "%load_ext autoreload\n%autoreload 2",
        "x = 1\nprint(x)",
    ], capsys)
    assert out.startswith("exit 0") and "2 cells: 2 same, 0 different" in out, out


def test_normalise_hides_whole_microsecond_cpu_times_and_where_ipykernel_compiles_cells() -> None:
    """%%time prints whole numbers below a millisecond ("user 14 µs"), and a warning names the cell's file in
    ipykernel's per-kernel temp folder (its pid in the name; under kernelexec in the session's tmp/)."""
    assert normalise("CPU times: user 263 ms, sys: 14 µs, total: 277 ms\nWall time: 1 s") == (
        "CPU times: user <time>, sys: <time>, total: <time>\nWall time: <time>")
    assert normalise("CPU times: user 2 µs, sys: 1e+03 ns, total: 3 µs\nWall time: 5.01 µs") == (  # IPython's %.3g of 1000
        "CPU times: user <time>, sys: <time>, total: <time>\nWall time: <time>")
    recorded = normalise("/tmp/ipykernel_17793/2608338407.py:2: UserWarning: careful")
    assert recorded == "<ipykernel>/2608338407.py:2: UserWarning: careful"
    assert normalise("/tmp/x/sessions/abc/tmp/ipykernel_2/2608338407.py:2: UserWarning: careful",
                     ["/tmp/x/sessions/abc"]) == recorded
    assert normalise('File "/var/folders/q1/T/ipykernel_5/17.py", line 1') == 'File "<ipykernel>/17.py", line 1'
    slow = ("The slowest run took 5.83 times longer than the fastest. This could mean that an intermediate result is being "
            "cached.\n4.1 µs ± 3.2 µs per loop (mean ± std. dev. of 7 runs, 100,000 loops each)\n")
    assert normalise(slow) == "<timeit>\n"  # %timeit's remark on a slow run comes and goes with the load
    assert normalise("> \x1b[32m/tmp/ipykernel_15028/40.py\x1b[39m(2)") == normalise(  # %debug's coloured frame line
        "> \x1b[32m/tmp/x/sessions/abc/tmp/ipykernel_2/40.py\x1b[39m(2)", ["/tmp/x/sessions/abc"]) == "> \x1b[32m<ipykernel>/40.py\x1b[39m(2)"


async def test_a_warning_in_a_jupyter_notebook_matches_whatever_the_kernels_pid(
        tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = await _nbclient_then_replay(tmp_path / "warn", short_tmp, [
        "import warnings\nwarnings.warn('careful')",
        "%%time\nsum(range(10))",
    ], capsys)
    assert out.startswith("exit 0") and "2 cells: 2 same, 0 different" in out, out


async def test_history_magics_in_a_jupyter_notebook_see_the_cells_before(
        tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """nbclient runs its kernel with history in memory (no file); kernelexec's had history off, so %history -l printed
    nothing. Now in memory too: the same lines."""
    out = await _nbclient_then_replay(tmp_path / "hist", short_tmp, [
        "x = 1\nx + 1",
        "%history -l 1",
        "%rerun 1",
    ], capsys)
    assert out.startswith("exit 0") and "3 cells: 3 same, 0 different" in out, out


async def test_a_module_that_is_not_installed_fails_as_under_nbclient(
        tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A module the profile does not allow and the environment does not have: ModuleNotFoundError, as without the
    guard (PDSH's `from pandas_datareader import data`), so a notebook's `except ModuleNotFoundError` still catches
    it; one that is installed but refused stays ImportError."""
    out = await _nbclient_then_replay(tmp_path / "missing", short_tmp, [
        "import no_such_module_kx",
        "try:\n    import no_such_module_kx\nexcept ModuleNotFoundError:\n    print('fallback')",
    ], capsys)
    assert "cell 1    DIFFERENT" in out and "raised ModuleNotFoundError: Import of no_such_module_kx is not allowed" in out, out
    assert "cell 2    same" in out, out


async def test_a_notebooks_own_modules_import_beside_it_and_written_by_a_cell(
        tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Python source in the notebook's folder is its own code: a helper beside it and one a cell writes (the
    %%file-then-import of many tutorials) import under standard as under nbclient, as a project's code does in a
    project environment; before, the allowlist refused both (ImportError)."""
    folder = tmp_path / "own"
    folder.mkdir()
    (folder / "helper_kx.py").write_text("VALUE = 41\n")
    out = await _nbclient_then_replay(folder, short_tmp, [
        "import helper_kx\nhelper_kx.VALUE",
        "with open('written_kx.py', 'w') as f:\n    f.write('def answer():\\n    return 42\\n')\n"
        "from written_kx import answer\nanswer()",
    ], capsys)
    assert out.startswith("exit 0") and "2 cells: 2 same, 0 different" in out, out


async def test_from_pylab_import_star_runs_as_under_nbclient(
        tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``pylab`` is matplotlib's own top-level module (``from matplotlib.pylab import *``), as old as notebooks:
    the standard profile refused it by its name while allowing matplotlib."""
    out = await _nbclient_then_replay(tmp_path / "pylab", short_tmp, ["from pylab import *\nx = linspace(0, 1, 3)\nx"], capsys)
    assert out.startswith("exit 0") and "1 cells: 1 same, 0 different" in out, out


async def test_a_pip_line_for_packages_the_environment_has_runs_the_rest_of_its_cell(
        tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`%pip install numpy` then the imports, in one cell (many public notebooks open so): Jupyter's pip finds numpy
    there and the imports run. Replay without --install skipped the whole cell, so every later cell failed with
    NameError; now the rest of the cell runs (nothing installed, the index not asked) and says so."""
    out = await _nbclient_then_replay(tmp_path / "pip", short_tmp, [
        "%pip install -q numpy\nimport numpy as np",
        "np.arange(3).tolist()",
    ], capsys)
    assert "skipped" not in out.split("installs recorded:")[-1].split("\n", 1)[-1], out
    assert "its pip line asks only for what the environment has (numpy " in out, out
    assert "cell 2    same" in out, out


async def test_getpass_getuser_answers_a_name_as_under_nbclient(
        tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sandbox shows no password database and the kernel's environment had no USER/LOGNAME: getuser() raised KeyError."""
    out = await _nbclient_then_replay(tmp_path / "user", short_tmp, ["import getpass\nbool(getpass.getuser())"], capsys)
    assert out.startswith("exit 0") and "1 cells: 1 same, 0 different" in out, out


async def test_a_cell_tagged_skip_execution_is_reported_skipped_and_left_as_it_is(
        tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """nbclient leaves a cell tagged skip-execution alone (its outputs too); replay did as well, but called it
    'not run before' and marked it completed."""
    from kernelexec.session.replay_cli import replay_command

    skipped = nbformat.v4.new_code_cell("print('long')", execution_count=3, metadata={"tags": ["skip-execution"]})
    skipped.outputs = [nbformat.v4.new_output("stream", name="stdout", text="long\n")]
    nb = nbformat.v4.new_notebook(cells=[skipped, nbformat.v4.new_code_cell("print('ok')")])
    path, out_path = tmp_path / "skip.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, path)
    code = await replay_command(make_settings(short_tmp), str(path), output=str(out_path), profile=None)
    out = capsys.readouterr().out
    assert code == 0 and "cell 1    skipped" in out and "tagged skip-execution" in out, out
    assert "1 skipped (cell 1)" in out, out
    first = nbformat.read(out_path, as_version=4).cells[0]
    assert first.outputs == skipped.outputs and first.metadata.kernelexec["replay_ending"] == "skipped"
