"""Kernels on a remote engine (``--kernel-gateway``): a real Jupyter Server, a real Jupyter Kernel Gateway and
a real Jupyter Enterprise Gateway (tests/gateways.py), each started here on 127.0.0.1 with a token, driven
through the in-memory MCP harness.

The "remote" engine runs on this machine, so the tests can also look at its processes and files;
nothing in kernelexec relies on that.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from kernelexec.backends import kernel_factory
from kernelexec.backends.gateway import GatewayKernel, remote_policy, startup_code
from kernelexec.config import load_settings
from kernelexec.errors import KernelStartError
from kernelexec.kernel.launch import LaunchSpec
from kernelexec.layout import SessionDirs
from kernelexec.sandbox.policy import kernel_policy
from kernelexec.server.build import build_server
from kernelexec.session.manager import SessionManager
from kernelexec.session.session import Session

from .conftest import Harness, free_port, make_settings
from .conftest import serving as harness_for
from .gateways import KINDS, Gateway, enterprise_gateway_command, running_gateway
from .test_stdin import Human

pytestmark = pytest.mark.anyio


def _gateway(kind: str, base: Path) -> Iterator[Gateway]:
    if kind == "enterprise_gateway" and enterprise_gateway_command() is None and not os.environ.get("CI"):
        pytest.skip("no Jupyter Enterprise Gateway here (.ci/run makes .ci/egw; see tests/gateways.py)")
    with running_gateway(kind, base) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def jupyter_server(short_tmp: Path) -> Iterator[Gateway]:
    yield from _gateway("jupyter_server", short_tmp)


@pytest.fixture(scope="module")
def kernel_gateway(short_tmp: Path) -> Iterator[Gateway]:
    yield from _gateway("kernel_gateway", short_tmp)


@pytest.fixture(scope="module")
def enterprise_gateway(short_tmp: Path) -> Iterator[Gateway]:
    yield from _gateway("enterprise_gateway", short_tmp)


@pytest.fixture(scope="module", params=KINDS)
def gw(request: pytest.FixtureRequest) -> Gateway:
    return request.getfixturevalue(request.param)


@asynccontextmanager
async def serving(base: Path, **overrides: Any) -> AsyncIterator[Harness]:
    async with harness_for(make_settings(base, **overrides)) as h:
        yield h


@pytest.fixture(scope="module")
async def remote(gw: Gateway, short_tmp: Path) -> AsyncIterator[Harness]:
    """A kernelexec server (standard profile) whose kernels run on ``gw``."""
    async with serving(short_tmp, kernel_gateway=gw.url, kernel_gateway_token=gw.token) as h:
        yield h


def kernel_of(h: Harness, session: str) -> GatewayKernel:
    kernel = h.sessions.sessions[session].kernel
    assert isinstance(kernel, GatewayKernel)
    return kernel


def parent_pid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


# --- through the gateway ---------------------------------------------------------------------------
async def test_kernel_runs_in_the_gateway_and_keeps_state(remote: Harness, gw: Gateway, short_tmp: Path) -> None:
    s = await remote.new_session()
    first = await remote.run("x = 1", session=s)
    second = await remote.run("x + 1", session=s)
    assert second["result"] == 2 and second["success"] is True
    assert second["execution_count"] == first["execution_count"] + 1
    assert second["layers"] == ["remote-gateway", "guard"]
    kernel = kernel_of(remote, s)
    assert kernel.km.kernel_id in gw.kernel_ids()  # the gateway lists it
    pid = (await remote.run("import os\nos.getpid()", session=s))["result"]
    assert parent_pid(pid) == gw.proc.pid  # started by the gateway process, not by this one
    async with serving(short_tmp) as local_server:  # a local kernel, for contrast
        local = (await local_server.run("import os\nos.getpid()"))["result"]
    assert local != pid and parent_pid(local) != gw.proc.pid
    assert "started remote kernel" in kernel.log_tail()


async def test_result_rules_hold_remotely(remote: Harness) -> None:
    s = await remote.new_session()
    assert (await remote.run("result = {'a': [1, 2]}\n'ignored'", session=s))["result"] == {"a": [1, 2]}
    assert (await remote.run("3 * 7", session=s))["result"] == 21
    assert (await remote.run("result = {1, 2}", session=s))["result"] == "{1, 2}"
    r = await remote.run("print('x')", session=s)
    assert r["result"] is None and r["stdout"] == "x\n"


async def test_errors_and_streams_come_back(remote: Harness) -> None:
    s = await remote.new_session()
    r = await remote.run("import sys\nprint('out')\nprint('err', file=sys.stderr)", session=s)
    assert r["stdout"] == "out\n" and r["stderr"] == "err\n"
    r = await remote.run("def f():\n    return 1/0\nf()", session=s)
    assert r["success"] is False
    assert r["error"] == "ZeroDivisionError: division by zero" and r["error_type"] == "ZeroDivisionError"
    assert any("return 1/0" in line for line in r["traceback"])
    assert not any("\x1b[" in line for line in r["traceback"])


async def test_plots_come_back_and_are_kept_on_the_server(remote: Harness) -> None:
    """Rich outputs travel over the WebSocket; the answer's files are the server's own."""
    s = await remote.new_session()
    r = await remote.run("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 3, 2])\nfig", session=s)
    assert r["success"] is True, r
    assert sorted(o["mime_type"] for o in r["outputs"]) == ["image/png"]
    for out in r["outputs"]:
        path = Path(out["path"])
        assert path.is_relative_to(remote.settings.sessions_dir) and path.stat().st_size == out["size"]


async def test_list_variables_uses_the_remote_builtins(remote: Harness) -> None:
    s = await remote.new_session()
    await remote.run("items = [1, 2, 3]\nname = 'n'", session=s)
    result = await remote.call("list_variables", session=s)
    found = {v["name"]: v for v in result.structured_content["variables"]}
    assert set(found) == {"items", "name"}
    assert found["items"]["length"] == 3 and found["items"]["type"] == "list"


async def test_the_guard_is_installed_in_the_remote_kernel(remote: Harness) -> None:
    s = await remote.new_session()
    r = await remote.run("import subprocess", session=s)
    assert r["error_type"] == "ImportError" and "not allowed in the 'standard' profile" in r["error"]
    # the session directory is the remote kernel's own, in its temp dir; writes elsewhere are refused
    r = await remote.run("import os, tempfile\nopen('notes.txt', 'w').write('hi')\n[os.getcwd(), tempfile.gettempdir()]", session=s)
    cwd, tmp = r["result"]
    assert cwd == os.path.join(os.path.dirname(tmp), "work") and os.path.basename(tmp) == "tmp"
    assert os.path.basename(os.path.dirname(cwd)) == f"kernelexec-{s}"
    assert not cwd.startswith(str(remote.settings.sessions_dir))
    assert Path(cwd, "notes.txt").read_text() == "hi"  # visible here only because the "remote" is local
    outside = os.path.join(os.path.dirname(os.path.dirname(tmp)), "elsewhere.txt")  # next to the session dir
    r = await remote.run(f"open({outside!r}, 'w')", session=s)
    assert r["error_type"] == "PolicyError" and "may write only under" in r["error"]


@pytest.mark.slow
async def test_timeout_interrupts_through_the_gateway(remote: Harness) -> None:
    s = await remote.new_session()
    await remote.run("before = 1", session=s)
    r = await remote.run("import time\ntime.sleep(60)", session=s, timeout=1)
    assert r["timed_out"] is True and r["ending"] == "interrupted"  # POST /interrupt reached it: no restart
    assert r["error_type"] == "KeyboardInterrupt"
    assert (await remote.run("before + 1", session=s))["result"] == 2
    assert "interrupted remote kernel" in kernel_of(remote, s).log_tail()


@pytest.mark.slow
async def test_a_cell_that_ignores_the_interrupt_gets_a_restart(gw: Gateway, short_tmp: Path) -> None:
    async with serving(short_tmp, kernel_gateway=gw.url, kernel_gateway_token=gw.token, profile="trusted",
                       interrupt_grace=1) as h:
        s = await h.new_session()
        r = await h.run("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)",
                        session=s, timeout=1)
        assert r["timed_out"] is True and r["ending"] == "restarted", r
        assert r["layers"] == ["remote-gateway"]  # trusted: no guard
        assert (await h.run("1 + 1", session=s))["result"] == 2


async def test_restart_session_restarts_the_remote_kernel_with_its_guard(remote: Harness, gw: Gateway) -> None:
    s = await remote.new_session()
    await remote.run("gone = 1", session=s)
    kernel_id = kernel_of(remote, s).km.kernel_id
    info = await remote.call("restart_session", session=s)
    assert info.structured_content["status"] == "restarted"
    assert (await remote.run("gone", session=s))["error_type"] == "NameError"
    assert kernel_of(remote, s).km.kernel_id == kernel_id in gw.kernel_ids()  # restarted in place, over REST
    assert (await remote.run("import subprocess", session=s))["error_type"] == "ImportError"


@pytest.mark.slow
async def test_a_kernel_that_dies_is_restarted_with_the_startup_code(remote: Harness) -> None:
    s = await remote.new_session()
    r = await remote.run("import os\nos._exit(3)", session=s, timeout=60)
    # the gateway restarts a dead kernel by itself, without our startup code; kernelexec notices and
    # restarts it again through _wait_ready, so the guard is back
    assert r["ending"] == "kernel_died", r
    assert "gateway" in r["restart_reason"]
    assert (await remote.run("1 + 1", session=s))["result"] == 2
    assert (await remote.run("import subprocess", session=s))["error_type"] == "ImportError"


async def test_restart_session_with_replay_refills_the_remote_kernel(remote: Harness) -> None:
    s = await remote.new_session()
    await remote.run("kept = 41", session=s)
    info = await remote.call("restart_session", session=s, replay=True)
    assert info.structured_content["status"] == "restarted"
    assert (await remote.run("kept + 1", session=s))["result"] == 42


async def test_a_kernel_deleted_on_the_gateway_is_replaced(remote: Harness, gw: Gateway) -> None:
    """Culled or deleted behind our back: the REST restart fails (404), so a new kernel is started, and the
    variables come back in it (its checkpoint, loaded inside the new kernel; tests/test_checkpoint.py)."""
    s = await remote.new_session()
    await remote.run("lost = 1", session=s)
    old_id = kernel_of(remote, s).km.kernel_id
    gw.api(f"/api/kernels/{old_id}", method="DELETE")
    r = await remote.run("lost", session=s)
    # noticed before the call (a notice in the answer, the variable back) or while running it (ending kernel_died)
    assert r["ending"] == "kernel_died" or r["result"] == 1, r
    assert "died" in r["restart_reason"] and "gateway" in r["restart_reason"]
    assert (await remote.run("lost", session=s))["result"] == 1
    new_id = kernel_of(remote, s).km.kernel_id
    assert new_id != old_id and new_id in gw.kernel_ids() and old_id not in gw.kernel_ids()
    assert (await remote.run("import subprocess", session=s))["error_type"] == "ImportError"


async def test_fork_session_of_a_gateway_kernel_travels_through_the_kernels(remote: Harness) -> None:
    """The server cannot reach a gateway kernel's files: the checkpoint goes from the source kernel to the fork's
    in pieces over the kernel protocol (a 9 MB value: three of them, through the gateway's WebSockets). Each side
    then changes alone."""
    s = await remote.new_session()
    await remote.run("shared = [1, 2]\nblob = bytes(range(256)) * 36_000", session=s)
    forked = await remote.call("fork_session", session=s)
    assert not forked.is_error, forked.content
    f = forked.structured_content["session"]
    assert {"shared", "blob"} <= set(forked.structured_content["restored"]["restored"]), forked.structured_content
    assert kernel_of(remote, f).km.kernel_id != kernel_of(remote, s).km.kernel_id
    assert not list((remote.settings.sessions_dir / f / "checkpoint").iterdir()), "copied through the host's files"
    await remote.run("shared.append('fork only')", session=f)
    await remote.run("shared.append('source only')", session=s)
    check = "result = (shared, len(blob), blob == bytes(range(256)) * 36_000)"
    assert (await remote.run(check, session=f))["result"] == [[1, 2, "fork only"], 9_216_000, True]
    assert (await remote.run(check, session=s))["result"] == [[1, 2, "source only"], 9_216_000, True]


@pytest.mark.slow
async def test_startup_code_failing_remotely_fails_closed(gw: Gateway, short_tmp: Path) -> None:
    """kernel_init's fail-closed exit happens remotely too: no kernel is handed out without its policy."""
    settings = make_settings(short_tmp, kernel_gateway=gw.url, kernel_gateway_token=gw.token)
    dirs = SessionDirs(settings.sessions_dir / "failclosed1")
    dirs.create()
    spec = LaunchSpec(dirs=dirs, cwd=dirs.work, policy={"spill_dir": str(dirs.outputs)})  # no profile: kernel_init exits 70
    kernel = kernel_factory(settings)(spec, startup_timeout=60)
    before = gw.kernel_ids()
    with pytest.raises(KernelStartError, match="startup code"):
        await kernel.start()
    assert gw.kernel_ids() == before  # the half-started kernel was deleted


# A kernel that exits during its first ``deaths`` launches, each alive long enough for the gateway's WebSocket
# handshake to send its kernel_info_request meanwhile; then this environment's ipykernel
DIES_AT_START = """import os, sys, time
marks, dying, connection_file = sys.argv[1], {int(n) for n in sys.argv[2].split(",")}, sys.argv[3]
launch = len(os.listdir(marks))
open(os.path.join(marks, str(launch)), "x").close()
if launch in dying:
    time.sleep(2)
    sys.exit(1)
os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", connection_file])
"""


@pytest.fixture(scope="module")
def restarting_gateway(short_tmp: Path) -> Iterator[tuple[Gateway, dict[str, Path]]]:
    """A Jupyter Server that restarts a dead kernel once (then drops it), offering kernels that die at some launches:
    ``dies-once`` (at its first; its restart runs), ``dies-twice`` (at its first two: the gateway gives up on it) and
    ``dies-on-restart`` (at the two after its first, as a kernel whose port was taken while it restarted)."""
    dying = {"dies-once": "0", "dies-twice": "0,1", "dies-on-restart": "1,2"}
    marks = {name: short_tmp / f"{name}-launches" for name in dying}
    for path in marks.values():
        path.mkdir()
    specs = {name: [sys.executable, "-c", DIES_AT_START, str(marks[name]), launches, "{connection_file}"]
             for name, launches in dying.items()}
    with running_gateway("jupyter_server", short_tmp, kernelspecs=specs,
                         args=("--KernelRestarter.restart_limit=1",)) as gateway:
        yield gateway, marks


def kernel_named(gateway: Gateway, base: Path, name: str, handle: str) -> GatewayKernel:
    settings = make_settings(base, kernel_gateway=gateway.url, kernel_gateway_token=gateway.token)
    spec = Session(handle, settings).launch_spec()
    return GatewayKernel(spec, startup_timeout=60, url=gateway.url, token=gateway.token, kernel_name=name)


@pytest.mark.slow
async def test_a_kernel_the_gateway_restarts_during_the_handshake_is_the_one_used(
        restarting_gateway: tuple[Gateway, dict[str, Path]], short_tmp: Path) -> None:
    """The kernel dies while Jupyter Server holds the WebSocket handshake on its kernel_info_request, and the
    gateway restarts it: the restarted kernel is the session's, reached by that handshake, and not taken for lost
    (no second kernel is started)."""
    gateway, marks = restarting_gateway
    kernel = kernel_named(gateway, short_tmp, "dies-once", "diesonce1")
    try:
        await kernel.start()
        assert await kernel.evaluate("6 * 7", timeout=30) == "42"
        assert sorted(os.listdir(marks["dies-once"])) == ["0", "1"]  # one death, one restart: the same kernel
        assert kernel.kernel_id in gateway.kernel_ids()
    finally:
        await kernel.shutdown()


@pytest.mark.slow
async def test_a_kernel_the_gateway_gives_up_on_during_its_start_is_replaced_once(
        restarting_gateway: tuple[Gateway, dict[str, Path]], short_tmp: Path) -> None:
    """Dead at its launch and at the gateway's one restart, the kernel is dropped by the gateway before it ever
    answered, while the WebSocket handshake waits on it: nothing ran there, so a new kernel is started (its launch
    runs) instead of failing the call. Before, the handshake waited out its 40 s and the start failed "kernel exited
    during startup ... the gateway no longer knows it" (CI at 8c430d5: one of 20 clients' first call; the gateway's
    log, kept in a rerun, showed why: the kernel's shell port taken, and every restart on the same ports)."""
    gateway, marks = restarting_gateway
    kernel = kernel_named(gateway, short_tmp, "dies-twice", "diestwice1")
    try:
        await kernel.start()
        assert await kernel.evaluate("6 * 7", timeout=30) == "42"
        assert sorted(os.listdir(marks["dies-twice"])) == ["0", "1", "2"]  # two deaths, then the new kernel's launch
        log = kernel.log_tail(10_000)
        assert "was lost before it answered" in log and "restarts failed" in log, log
        assert gateway.kernel_ids() == {kernel.kernel_id}
    finally:
        await kernel.shutdown()


@pytest.mark.slow
async def test_a_kernel_the_gateway_gives_up_on_while_it_restarts_is_replaced(
        restarting_gateway: tuple[Gateway, dict[str, Path]], short_tmp: Path) -> None:
    """A restart in place that dies at its launch and at the gateway's one restart (jupyter_client restarts on the
    same cached ports, so a port taken meanwhile kills every one): the gateway gives up on the kernel, and
    ``Kernel.restart`` falls back to a new kernel (new ports) that works."""
    gateway, marks = restarting_gateway
    kernel = kernel_named(gateway, short_tmp, "dies-on-restart", "diesrestart1")
    try:
        await kernel.start()
        first = kernel.kernel_id
        assert await kernel.evaluate("6 * 7", timeout=30) == "42"
        await kernel.restart()
        assert await kernel.evaluate("6 * 7", timeout=30) == "42"
        assert sorted(os.listdir(marks["dies-on-restart"])) == ["0", "1", "2", "3"]  # two deaths, then a new kernel
        assert kernel.kernel_id != first and gateway.kernel_ids() == {kernel.kernel_id}
    finally:
        await kernel.shutdown()


async def test_close_session_deletes_the_remote_kernel(remote: Harness, gw: Gateway) -> None:
    s = await remote.new_session()
    await remote.run("1", session=s)
    kernel_id = kernel_of(remote, s).km.kernel_id
    assert kernel_id in gw.kernel_ids()
    closed = await remote.call("close_session", session=s)
    assert closed.structured_content["status"] == "closed"
    assert kernel_id not in gw.kernel_ids()


async def test_spilled_files_live_on_the_remote_machine(gw: Gateway, short_tmp: Path) -> None:
    async with serving(short_tmp, kernel_gateway=gw.url, kernel_gateway_token=gw.token, kernel_stream_cap=1000) as h:
        r = await h.run("print('y' * 5000)")
        path = r["stdout_file"]
        assert f"/kernelexec-{r['session']}/spill/" in path  # the remote kernel's path
        assert not path.startswith(str(h.settings.sessions_dir))
        assert Path(path).read_text().startswith("y" * 5000)  # readable here only because the "remote" is local


async def test_a_wrong_token_is_a_clear_error(gw: Gateway, short_tmp: Path) -> None:
    async with serving(short_tmp, kernel_gateway=gw.url, kernel_gateway_token="wrong") as h:
        result = await h.call("execute_code", code="1")
        assert result.is_error
        assert "--kernel-gateway-token" in result.content[0].text


async def test_an_unreachable_gateway_is_a_clear_error(short_tmp: Path) -> None:
    async with serving(short_tmp, kernel_gateway=f"http://127.0.0.1:{free_port()}", kernel_gateway_token="t") as h:
        result = await h.call("execute_code", code="1")
        assert result.is_error
        assert "is the gateway running" in result.content[0].text


@pytest.mark.slow
async def test_two_gateways_in_one_process(jupyter_server: Gateway, kernel_gateway: Gateway, short_tmp: Path) -> None:
    """Each kernel uses its own gateway's URL and token: nothing goes through GatewayClient.instance()."""
    async with serving(short_tmp, kernel_gateway=jupyter_server.url, kernel_gateway_token=jupyter_server.token) as a, \
            serving(short_tmp, kernel_gateway=kernel_gateway.url, kernel_gateway_token=kernel_gateway.token) as b:
        answers: dict[str, Any] = {}

        async def run(name: str, h: Harness) -> None:
            session = await h.new_session()
            answers[name] = (h, session, await h.run(f"where = {name!r}\nwhere", session=session))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "a", a)
            tg.start_soon(run, "b", b)
        for name, gateway, other in (("a", jupyter_server, kernel_gateway), ("b", kernel_gateway, jupyter_server)):
            h, session, answer = answers[name]
            assert answer["result"] == name
            kernel_id = kernel_of(h, session).km.kernel_id
            assert kernel_id in gateway.kernel_ids() and kernel_id not in other.kernel_ids()


# --- no gateway needed -----------------------------------------------------------------------------
def test_the_remote_policy_carries_no_server_paths(tmp_path: Path) -> None:
    common = dict(session_dir=tmp_path / "session", spill_dir=tmp_path / "session" / "outputs",
                  work_roots=[tmp_path / "work"], read_dirs=[tmp_path / "data"], allow_imports=[],
                  result_cap=10, stream_cap=10, disk_cap=10)
    standard = remote_policy(kernel_policy("standard", **common))
    assert str(tmp_path) not in json.dumps(standard) and sys.prefix not in json.dumps(standard)
    assert standard["write_roots"] == ["<session>"] and standard["read_roots"] == ["<python>"]
    assert "spill_dir" not in standard
    assert remote_policy(kernel_policy("strict", **common))["write_roots"] == []
    assert "read_roots" not in remote_policy(kernel_policy("trusted", **common))
    code = startup_code(kernel_policy("standard", **common), "handle123")
    compile(code, "<startup>", "exec")
    assert "def install(policy" in code and "class Runtime" in code and "_kernelexec_boot()" in code


def test_layers_name_the_gateway(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, kernel_gateway="http://127.0.0.1:1", kernel_gateway_token="t")
    bound = kernel_factory(settings)
    for profile, layers in (("standard", ["remote-gateway", "guard"]), ("trusted", ["remote-gateway"])):
        spec = LaunchSpec(dirs=SessionDirs(tmp_path / profile), cwd=tmp_path, policy={"profile": profile})
        kernel = bound(spec)
        assert isinstance(kernel, GatewayKernel)
        assert (kernel.url, kernel.token) == ("http://127.0.0.1:1", "t")
        assert spec.plan.layers == layers


# --- input() and getpass() through the gateway's WebSocket ----------------------------------------------
async def test_input_and_getpass_are_asked_through_the_gateway(gw: Gateway, short_tmp: Path) -> None:
    """The stdin channel over the gateway's WebSocket: input() an elicitation, getpass() its one-time page,
    a declined question an EOFError; answers recorded as locally (the secret never)."""
    settings = make_settings(short_tmp, kernel_gateway=gw.url, kernel_gateway_token=gw.token, pool_size=0, restart_spares=0)
    human = Human(("accept", "Ada"), ("accept", "s3cret"), ("decline", None))
    async with SessionManager(settings).running() as sessions, \
            Client(build_server(settings, sessions), mode="legacy", elicitation_callback=human) as client:
        r: Any = (await client.call_tool("execute_code", {"code": "name = input('Your name? ')\nname"})).structured_content
        assert r["result"] == "Ada" and r["layers"] == ["remote-gateway", "guard"], r
        r = (await client.call_tool("execute_code", {"code": "import getpass\np = getpass.getpass('Token: ')\nlen(p)"})).structured_content
        assert r["result"] == 6, r
        r = (await client.call_tool("execute_code", {"code": "input('again? ')"})).structured_content
        assert not r["success"] and r["error_type"] == "EOFError", r
        r = (await client.call_tool("execute_code", {"code": "1 + 1"})).structured_content
        assert r["result"] == 2, r
        notebook = json.loads(Path(r["notebook"]).read_text())
    assert "Your name?" in human.asked[0] and len(human.urls) == 1  # getpass: its page, never a form
    recorded = [c["metadata"]["kernelexec"].get("inputs") for c in notebook["cells"] if c["cell_type"] == "code"]
    assert recorded[0][0]["answer"] == "Ada" and recorded[1][0]["answer"] == "***", recorded
    assert "s3cret" not in json.dumps(notebook)


async def test_send_input_answers_a_gateway_kernels_question(gw: Gateway, short_tmp: Path) -> None:
    """A client without elicitation: the run waits (awaiting_input) with its question_id; send_input answers
    it through the WebSocket; a second answer to the same question is refused; the kernel keeps its state."""
    settings = make_settings(short_tmp, kernel_gateway=gw.url, kernel_gateway_token=gw.token, pool_size=0, restart_spares=0)
    async with SessionManager(settings).running() as sessions, \
            Client(build_server(settings, sessions), mode="legacy") as client:
        first = await client.call_tool("execute_code", {"code": "kept = 1\nname = input('Your name? ')\nf'hi {name}'"})
        r: Any = first.structured_content
        assert r["ending"] == "awaiting_input" and r["input_prompt"] == "Your name? " and r["question_id"], r
        sent = await client.call_tool("send_input", {"run_id": r["run_id"], "question_id": r["question_id"], "text": "Ada"})
        done: Any = sent.structured_content
        assert done["result"] == "hi Ada" and done["run_id"] == r["run_id"], done
        again = await client.call_tool("send_input", {"run_id": r["run_id"], "question_id": r["question_id"], "text": "late"})
        assert again.is_error and "already answered" in again.content[0].text  # type: ignore[union-attr]
        done = (await client.call_tool("execute_code", {"code": "import getpass\ngetpass.getpass('Token: ')"})).structured_content
        assert done["error_type"] == "EOFError" and "--secret" in done["error"], done  # no URL mode: refused, said why
        done = (await client.call_tool("execute_code", {"code": "kept + 1", "session": r["session"]})).structured_content
        assert done["result"] == 2, done


@pytest.mark.slow
async def test_enterprise_gateway_starts_kernels_for_the_kernel_username_it_is_given(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Enterprise Gateway as it ships refuses root: a server running as root without KERNEL_USERNAME gets the
    gateway's reason and what to set; with KERNEL_USERNAME in its environment, the kernel starts and has it."""
    if enterprise_gateway_command() is None and not os.environ.get("CI"):
        pytest.skip("no Jupyter Enterprise Gateway here (.ci/run makes .ci/egw; see tests/gateways.py)")
    if os.geteuid() != 0:
        pytest.skip("Enterprise Gateway refuses root only: this test runs as root")
    with running_gateway("enterprise_gateway", short_tmp, strict=True) as eg:
        monkeypatch.delenv("KERNEL_USERNAME", raising=False)
        async with serving(short_tmp, kernel_gateway=eg.url, kernel_gateway_token=eg.token) as h:
            refused = await h.call("execute_code", code="1")
            assert refused.is_error
            text = refused.content[0].text
            assert "403" in text and "not authorized" in text and "kernelexec passes on from its own environment" in text, text
        monkeypatch.setenv("KERNEL_USERNAME", "analyst")
        async with serving(short_tmp, kernel_gateway=eg.url, kernel_gateway_token=eg.token, profile="trusted") as h:
            r = await h.run("import os\nos.environ.get('KERNEL_USERNAME')")
            assert r["result"] == "analyst", r
            assert kernel_of(h, r["session"]).km.kernel_id in eg.kernel_ids()
