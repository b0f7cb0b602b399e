"""One attacking test per security claim (docs/security.md) that no other test tried to break.

Each test attacks as a cell or a hostile file would, and judges from outside the product: the host's
/proc, files on disk, sockets, a real ``kernelexec`` process. Where the guard lives in this process, a
parametrized negative control switches it off (a setting, or the guard monkeypatched away in the in-memory
server) and asserts the attack then *succeeds*, so the judge is shown able to fail. Where it lives in a
child process (``replay``'s escaping, ``serve``'s Host check) or in two places at once (fail-closed start-up:
the kernel's exit 70 and the server's policy probe), it was shown on a mutated tree instead, outside the
suite: ``terminal.safe`` returning its text unchanged turns the replay test red (ESC, U+202E raw from the
notebook's file name); ``cli.serve`` passing ``TransportSecuritySettings(enable_dns_rebinding_protection=
False)`` turns the Host test red (``evil.example`` answered 200); removing both ``os._exit(70)`` in
startup/kernel_init.py and the probe's raise in ``Kernel.start`` turns the fail-closed test red (its
canary written by an unguarded cell); removing only one of them still fails closed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import nbformat
import pytest

from kernelexec.store import open_store

from .conftest import Harness, clean_env, free_port, kernelexec_cmd, make_settings, serving, stop, wait_for_port
from .redteam.world import kernel_pids
from .test_hostile_kernel import SENDER

pytestmark = pytest.mark.anyio

QUIET = {"pool_size": 0, "restart_spares": 0}  # no kernel started before a test's patch is in place


def kernel_pid(h: Harness, session: str) -> int:
    """The host pid of the session's kernel itself (not bubblewrap around it), found in the host's /proc."""
    pids = kernel_pids(h.sessions.sessions[session].dirs.root)
    assert len(pids) == 1, pids  # positive control: the judge looks at exactly one real kernel
    return pids[0]


def proc_limit(pid: int, name: str) -> tuple[str, str]:
    """(soft, hard) of one rlimit as the host's /proc/<pid>/limits shows it."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith(name):
            soft, hard = line[len(name):].split()[:2]
            return soft, hard
    raise AssertionError(f"{name!r} not in /proc/{pid}/limits")


# --- 1. --cpu-seconds: RLIMIT_CPU over a kernel's life ---------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("limited", [True, False], ids=["cpu-limit", "control-no-limit"])
async def test_cpu_seconds_stops_a_busy_loop_and_the_session_recovers(short_tmp: Path, limited: bool) -> None:
    async with serving(make_settings(short_tmp, cpu_seconds=2 if limited else 0, **QUIET)) as h:
        session = await h.new_session()
        await h.run("1", session=session)
        pid = kernel_pid(h, session)
        soft, hard = proc_limit(pid, "Max cpu time")
        burn = await h.run("while True:\n    pass", session=session, timeout=20)
        if not limited:  # control: without the limit only the call's timeout stops it
            assert (soft, hard) == ("unlimited", "unlimited")
            assert burn["ending"] == "interrupted", burn
            return
        assert (soft, hard) == ("2", "2"), (soft, hard)
        assert burn["ending"] == "kernel_died", burn
        assert "SIGXCPU" in json.dumps(burn) or "SIGKILL" in json.dumps(burn), burn
        after = await h.run("6 * 7", session=session)
        assert after["result"] == 42, after


# --- 2. core dumps off (RLIMIT_CORE 0) -------------------------------------------------------------

def _core_files(*roots: Path) -> list[Path]:
    """Core files (core_pattern "core" or "core.<pid>") anywhere under ``roots``."""
    return [p for root in roots for p in root.rglob("core*") if p.is_file() and re.fullmatch(r"core(\.\d+)?", p.name)]


@pytest.mark.slow
@pytest.mark.parametrize("core_off", [True, False], ids=["core-off", "control-core-allowed"])
async def test_a_crashing_kernel_leaves_no_core_file(short_tmp: Path, core_off: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if Path("/proc/sys/kernel/core_pattern").read_text().startswith("|"):
        pytest.skip("core_pattern pipes cores to a handler: no file to look for")  # pragma: no cover
    if not core_off:  # control: the plan's RLIMIT_CORE raised, the same crash leaves a core
        import kernelexec.sandbox.plan

        original = kernelexec.sandbox.plan.plan_for

        def core_allowed(*args: Any, **kwargs: Any) -> Any:
            plan = original(*args, **kwargs)
            if "rlimits" in plan.wrapper:
                plan.wrapper["rlimits"]["core"] = 1 << 30
            return plan

        monkeypatch.setattr(kernelexec.sandbox.plan, "plan_for", core_allowed)
        monkeypatch.setattr("kernelexec.session.session.plan_for", core_allowed, raising=False)
    async with serving(make_settings(short_tmp, **QUIET)) as h:
        session = await h.new_session()
        await h.run("1", session=session)
        pid = kernel_pid(h, session)
        soft, hard = proc_limit(pid, "Max core file size")
        root = h.sessions.sessions[session].dirs.root
        crash = await h.run("import os\nos.abort()", session=session, timeout=30)
        assert crash["ending"] == "kernel_died" and "SIGABRT" in json.dumps(crash), crash
        cores = sorted(set(_core_files(root, h.settings.state_dir)))  # every directory the kernel could write is in its session
        if core_off:
            assert (soft, hard) == ("0", "0"), (soft, hard)
            assert cores == [], cores
        else:
            assert soft != "0"
            assert cores, "control: with RLIMIT_CORE raised the crash should have left a core file"
            for core in cores:
                core.unlink()
        assert (await h.run("1 + 1", session=session))["result"] == 2


# --- 3. a start-up failure fails closed ------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("broken", [True, False], ids=["broken-policy", "control-valid-policy"])
async def test_a_policy_the_startup_code_cannot_install_never_runs_a_cell(
        short_tmp: Path, broken: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import kernelexec.session.session

    original = kernelexec.session.session.kernel_policy

    def bad_policy(*args: Any, **kwargs: Any) -> dict[str, Any]:
        policy = original(*args, **kwargs)
        if broken:
            policy["allowed_imports"] = 5  # the guard's set(...) of it raises in the kernel's start-up code
        return policy

    monkeypatch.setattr(kernelexec.session.session, "kernel_policy", bad_policy)
    async with serving(make_settings(short_tmp, **QUIET)) as h:
        opened = await h.call("new_session")
        ran = await h.call("execute_code", code="open('ran-unguarded', 'w').write('x')\n'ran'", timeout=60)
        canaries = list(h.settings.state_dir.rglob("ran-unguarded"))
        texts = [" ".join(getattr(c, "text", "") for c in r.content) for r in (opened, ran)]
        if broken:
            assert canaries == [], "a cell ran in a kernel whose guard was never installed"
            for result, text in zip((opened, ran), texts, strict=True):
                assert result.is_error, result
                # the kernel exits (70) in its start-up code; if the server's probe reaches it first, that refuses it
                assert re.search("kernel exited during startup|kernel started without its policy", text), text
            # and no such kernel is left running, judged in the host's /proc
            roots = [p for p in h.settings.sessions_dir.iterdir() if p.is_dir()]
            # new_session's attempt gave its place and its empty directory back; execute_code's kept its record
            assert len(roots) == 1, roots
            for _ in range(50):
                alive = kernel_pids(h.settings.sessions_dir, every_session=True)  # the directory-less one's too
                if not alive:
                    break
                await anyio.sleep(0.1)
            assert not alive, f"kernels without their guard still running: {alive}"
        else:
            assert not opened.is_error and not ran.is_error, texts
            assert len(canaries) == 1, canaries
            assert len(kernel_pids(h.settings.sessions_dir, every_session=True)) >= 2  # the judge above sees kernels


# --- 4. the server's per-cell caps on rich outputs -------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("capped", [True, False], ids=["caps", "control-caps-raised"])
async def test_a_display_flood_past_the_kernel_stays_bounded_in_answer_and_notebook(
        short_tmp: Path, capped: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not capped:
        import functools

        import kernelexec.kernel.driver

        monkeypatch.setattr(kernelexec.kernel.driver, "Caps", functools.partial(kernelexec.kernel.driver.Caps, max_outputs=10_000))
    async with serving(make_settings(short_tmp, **QUIET)) as h:
        session = await h.new_session()
        await h.run(SENDER, session=session)
        # paced a little so that the kernel's own IOPub high-water mark (1,000 queued) does not drop them first
        flood = ("import time\nfor i in range(1500):\n    _send('display_data', {'data': {'text/plain': f'd{i}'}, 'metadata': {}})\n"
                 "    if i % 50 == 49:\n        time.sleep(0.05)\nprint('end')")
        answer = await h.run(flood, session=session, timeout=120)
        nb = nbformat.read(h.sessions.sessions[session].dirs.notebook, as_version=4)
        kept = [o for o in nb.cells[-1].outputs if o.output_type == "display_data"]
        assert answer["success"], answer
        if not capped:  # control: caps raised, the flood lands whole in the notebook
            assert len(kept) > 1000, len(kept)
            return
        assert len(kept) == 1000, len(kept)  # positive control: the flood reached the cap
        dropped = [n for n in answer["notes"] if re.search(r"dropped [\d,]+ rich output beyond 1,000 per cell", n)]
        assert dropped, answer["notes"]
        assert kept[0].data["text/plain"] == "d0"  # the head is kept
        # the record says so too, or the notebook (and the journal it is built from) would look complete
        assert nb.cells[-1].metadata["kernelexec"]["notes"] == answer["notes"], nb.cells[-1].metadata
        journal = [json.loads(line) for line in h.sessions.sessions[session].dirs.journal.read_text().splitlines()]
        assert dropped[0] in journal[-1]["metadata"]["kernelexec"]["notes"]


@pytest.mark.slow
@pytest.mark.parametrize("capped", [True, False], ids=["cap", "control-cap-raised"])
async def test_two_hundred_mib_of_rich_output_keeps_128_mib_at_most(
        short_tmp: Path, capped: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not capped:
        import functools

        import kernelexec.kernel.driver

        monkeypatch.setattr(kernelexec.kernel.driver, "Caps", functools.partial(kernelexec.kernel.driver.Caps, max_total_bytes=1 << 30))
    async with serving(make_settings(short_tmp, **QUIET)) as h:
        session = await h.new_session()
        await h.run(SENDER, session=session)
        flood = ("blob = 'x' * (25 << 20)\nfor i in range(8):\n    _send('display_data', {'data': {'text/plain': blob}, 'metadata': {}})\n"
                 "del blob\nprint('end')")
        answer = await h.run(flood, session=session, timeout=300)
        nb = nbformat.read(h.sessions.sessions[session].dirs.notebook, as_version=4)
        kept = sum(len(o.get("data", {}).get("text/plain", "")) for o in nb.cells[-1].outputs)
        if not capped:  # control: the cap raised, all 200 MiB land in the notebook
            assert kept == 200 << 20, kept
            return
        assert 100 << 20 <= kept <= 128 << 20, kept  # positive control: the flood did reach the server
        assert any(re.search(r"dropped 3 rich outputs beyond 134,217,728 characters per cell", n) for n in answer["notes"]), answer["notes"]
        assert nb.cells[-1].metadata["kernelexec"]["notes"] == answer["notes"], nb.cells[-1].metadata  # recorded too
        assert Path(h.sessions.sessions[session].dirs.notebook).stat().st_size < 140 << 20
        assert (await h.run("1 + 1", session=session))["result"] == 2


# --- 5. a tampered session.json working_dir on revival ---------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("checked", [True, False], ids=["checked", "control-check-off"])
async def test_a_tampered_working_dir_in_session_json_is_not_used_on_revival(
        short_tmp: Path, checked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without bubblewrap, so that the check alone is judged: bubblewrap's mount namespace has no such
    directory, and the kernel lands in its work/ even with the check switched off."""
    settings = make_settings(short_tmp, disable_layers=["bubblewrap"], **QUIET)
    async with serving(settings) as h:
        session = await h.new_session()  # no cell: a revival replaying the journal would chdir to each cell's own
        meta_file = h.sessions.sessions[session].dirs.meta
        work = h.sessions.sessions[session].dirs.work
    target = settings.sessions_dir  # every session's journal, notebook and connection keys
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "working_dir": str(target)}))
    # revival reads the session store, never session.json (tests/test_store_migration.py); the store is out of
    # every kernel's reach, so to judge the check itself the store's record is tampered the same way here
    store = await open_store(settings.store.get_secret_value() if settings.store is not None else None,
                             settings.state_dir)
    try:
        record = await store.get_session(session, owner=None)
        assert record is not None
        await store.put_session(dataclasses.replace(record, working_dir=str(target)))
    finally:
        await store.close()
    if not checked:
        from kernelexec.session.session import Session

        monkeypatch.setattr(Session, "resolve_working_dir", lambda self, wd: None if wd is None else Path(wd))
    async with serving(settings) as h2:
        result = await h2.call("execute_code", code="import os\nos.getcwd()", session=session)
    cwd = (result.structured_content or {}).get("result")
    if checked:
        assert cwd != str(target), "the revived session ran in the tampered working_dir"
        assert result.is_error or cwd == str(work), result
    else:
        assert cwd == str(target), result


# --- 6. replay prints a hostile notebook escaped ---------------------------------------------------

HOSTILE = ["\x1b]52;c;ZXZpbA==\x07", "\x1b[2J\x1b[31m", "\x9b31m", "\x85", "\u202e", "\u2066"]
RAW = re.compile("[\x1b\x07\x9b\x85\u202e\u2066]")


def _hostile_notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    payload = "".join(HOSTILE)
    cell = nbformat.v4.new_code_cell(f"print({payload!r})\n# {payload}")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"recorded {payload}\n")]
    nb.cells = [cell, nbformat.v4.new_markdown_cell(payload)]
    nb.metadata["kernelexec"] = {"profile": payload}
    nbformat.write(nb, path)


@pytest.mark.slow
def test_replay_of_a_hostile_notebook_prints_no_raw_control_characters(short_tmp: Path) -> None:
    (short_tmp / "nbdir").mkdir()
    nb = short_tmp / "nbdir" / "hostile\x1b[8m\u202egnp.ipynb"  # its name too: printed without repr()
    _hostile_notebook(nb)
    assert RAW.search(nb.read_text(encoding="utf-8").encode().decode("unicode_escape", errors="ignore")), \
        "control: the notebook carries the escapes (the judge would see them)"
    proc = subprocess.run(
        kernelexec_cmd("replay", str(nb), "--working-dir", str(nb.parent), "--state-dir", str(short_tmp / "replay-state"), "--pool-size", "0",
                       "--restart-spares", "0"),
        env=clean_env(), capture_output=True, timeout=180)
    out = proc.stdout.decode("utf-8", errors="replace") + proc.stderr.decode("utf-8", errors="replace")
    # positive control: the hostile text itself was printed (escaped), from the metadata, the source and both outputs
    assert out.count(r"\x1b]52;c;ZXZpbA==\x07") >= 4 and r"\u202e" in out and r"\x9b" in out, out
    assert "hostile" in out and "gnp.ipynb" in out, out
    found = sorted({f"U+{ord(c):04X}" for c in RAW.findall(out)})
    assert not found, f"replay printed raw control characters {found}:\n{out[:2000]!r}"


# --- 7. the HTTP Host check against DNS rebinding --------------------------------------------------

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@pytest.mark.slow
def test_http_refuses_a_rebinding_host_and_runs_nothing(short_tmp: Path) -> None:
    state = short_tmp / "http-host"
    port = free_port()
    proc = subprocess.Popen(
        kernelexec_cmd("serve", "--transport", "http", "--port", str(port), "--state-dir", str(state),
                       "--pool-size", "0", "--restart-spares", "0"),
        env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "execute_code", "arguments": {"code": "open('rebinding-canary', 'w').write('x')"}}}

    def canaries() -> list[Path]:
        return list(state.rglob("rebinding-canary"))

    try:
        wait_for_port(port, proc)
        url = f"http://127.0.0.1:{port}/mcp"
        with httpx.Client(timeout=60) as client:
            for host in ("evil.example", f"evil.example:{port}", f"rebind.127.0.0.1.nip.io:{port}", f"127.0.0.1.evil.example:{port}"):
                for body in (INIT, call):
                    r = client.post(url, json=body, headers={**HEADERS, "Host": host})
                    assert 400 <= r.status_code < 500, (host, r.status_code, r.text[:200])
            assert canaries() == []
            for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
                r = client.post(url, json=INIT, headers={**HEADERS, "Host": host})
                assert r.status_code == 200, (host, r.status_code, r.text[:200])  # control: the same request passes
            # positive control: the same call through the accepted host does run, and the judge sees its canary
            good = {**HEADERS, "Host": f"127.0.0.1:{port}"}
            sid = r.headers.get("mcp-session-id")
            if sid:
                good["mcp-session-id"] = sid
            good["mcp-protocol-version"] = "2025-06-18"
            client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=good)
            r = client.post(url, json=call, headers=good)
            assert r.status_code == 200, (r.status_code, r.text[:300])
        assert len(canaries()) == 1, (canaries(), r.text[:500])
    finally:
        stop(proc)


# --- 8. two servers on one state dir ---------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("locked", [True, False], ids=["lock", "control-no-lock"])
async def test_two_servers_on_one_state_dir_never_share_a_session(
        short_tmp: Path, locked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not locked:
        import kernelexec.session.session

        monkeypatch.setattr(kernelexec.session.session, "_claim", lambda root, handle: os.open(os.devnull, os.O_RDONLY))
    settings = make_settings(short_tmp, **QUIET)
    async with serving(settings) as a, serving(settings) as b:
        session = await a.new_session()
        await a.run("x = 'A'", session=session)
        result = await b.call("execute_code", code="import os\n(os.getpid(), globals().get('x'))", session=session)
        running = kernel_pids(a.sessions.sessions[session].dirs.root)  # judged in the host's /proc
        if locked:
            assert result.is_error, result
            assert "is in use by another kernelexec server" in result.content[0].text, result.content
            assert b.sessions.sessions.get(session) is None
            assert (await a.run("x", session=session))["result"] == "A"
            assert len(running) == 1, running
        else:  # control: without the lock the second server runs a second kernel in the same session directory
            assert not result.is_error, result
            assert b.sessions.sessions[session].kernel is not None
            assert len(running) == 2, running  # two kernels writing one session's journal and notebook


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-x", "-q"]))
