"""Code mode: cells call the user's other MCP servers as ``mcp_tools.<server>.<tool>(...)``, brokered by the server.

Two real upstream servers written with the SDK (tests/codemode_upstream.py): ``local`` over stdio and ``remote``
over streamable HTTP on 127.0.0.1, driven through kernelexec by a real MCP client whose elicitation callback is
the human. Replay serves the recorded results offline, or calls the live servers with ``--live-tools``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_types import ElicitResult

from kernelexec.codemode.broker import Broker
from kernelexec.codemode.config import ToolsConfigError, load, matches, python_name, server_attr
from kernelexec.codemode.schema import schema_problem
from kernelexec.errors import KernelexecError
from kernelexec.host import KernelReach
from kernelexec.kernel.stdin import TOOL_CALL_MARK
from kernelexec.server.build import build_server
from kernelexec.session.manager import SessionManager

from .conftest import clean_env, free_port, kernelexec_cmd, make_settings, wait_for_port
from .gateways import KINDS, enterprise_gateway_command, running_gateway

pytestmark = pytest.mark.anyio

UPSTREAM = Path(__file__).resolve().parent / "codemode_upstream.py"
CALLABLE = ["*.forecast", "*.add", "*.shout", "*.pixel", "*.fail", "*.slow", "*.pid", "*.crash", "*.transfer", "*.counter"]


class Human:
    """The elicitation callback: records each question, answers from a script (approve / decline)."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, dict[str, Any] | None]] = []
        self.asked: list[str] = []

    async def __call__(self, context: Any, params: Any) -> ElicitResult:
        self.asked.append(params.message)
        action, content = self.answers.pop(0) if self.answers else ("decline", None)
        return ElicitResult(action=action, content=content)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def remote_port() -> Iterator[int]:
    """The HTTP upstream, its own process on 127.0.0.1."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(UPSTREAM), "http", "remote", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=clean_env())
    try:
        wait_for_port(port, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def write_config(folder: Path, port: int | None, *, offset: str = "0") -> Path:
    servers: dict[str, Any] = {
        "local": {"command": sys.executable, "args": [str(UPSTREAM), "stdio", "local"], "env": {"LIVE_OFFSET": offset}},
        "kernelexec": {"command": "kernelexec", "args": ["serve"]},  # its own entry: skipped
    }
    if port is not None:
        servers["remote"] = {"type": "http", "url": f"http://127.0.0.1:{port}/mcp", "headers": {"Authorization": "Bearer s3cr3t-t0ken"}}
    path = folder / f"tools-{offset}.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


@pytest.fixture(scope="module")
def config_dir() -> Iterator[Path]:
    """Outside every work root and session directory: no kernel can write it."""
    with tempfile.TemporaryDirectory(prefix="kxtools") as folder:
        yield Path(folder)


@dataclass
class Served:
    client: Client
    human: Human
    sessions: SessionManager
    settings: Any

    async def run(self, code: str, **arguments: Any) -> dict[str, Any]:
        result = await self.client.call_tool("execute_code", {"code": code, **arguments})
        assert not result.is_error, result.content
        assert result.structured_content is not None
        return result.structured_content


@pytest.fixture(scope="module")
async def served(short_tmp: Path, config_dir: Path, remote_port: int) -> AsyncIterator[Served]:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0, tools_config=str(write_config(config_dir, remote_port)),
                             tools_allow=CALLABLE, tools_approve=["*.transfer"], tools_call_timeout=3.0)
    human = Human()
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy", elicitation_callback=human) as client:
            await client.call_tool("execute_code", {"code": "import mcp_tools"})  # each test stands alone (-k, --dist load)
            yield Served(client, human, sessions, settings)


# --- the calls ------------------------------------------------------------------------------------
async def test_execute_code_describes_each_callable_tool_in_one_line(served: Served) -> None:
    tools = {t.name: t for t in (await served.client.list_tools()).tools}
    description = tools["execute_code"].description or ""
    assert "mcp_tools.local.forecast(city, days)" in description and "mcp_tools.remote.add(a, b)" in description
    assert "secret" not in description and "kernelexec." not in description  # refused, and its own entry skipped


async def test_structured_text_and_image_results_from_both_servers(served: Served) -> None:
    r = await served.run("import mcp_tools\nmcp_tools.local.forecast(city='Oslo', days=2)")
    assert r["result"] == {"city": "Oslo", "high_c": 22.5, "server": "local"}, r
    r = await served.run("mcp_tools.remote.add(a=2, b=40)")  # the SDK wrapped 42 as {"result": 42}: unwrapped
    assert r["result"] == 42, r
    r = await served.run("mcp_tools.remote.shout(text='hi')")
    assert r["result"] == "HI!", r
    answer = await served.client.call_tool("execute_code", {"code": "mcp_tools.local.pixel()"})
    assert any(c.type == "image" and c.mime_type == "image/png" for c in answer.content), answer.content


async def test_help_signature_and_list_come_from_the_schema(served: Served) -> None:
    r = await served.run("import inspect, mcp_tools\nprint(mcp_tools.local.forecast.__doc__)\nstr(inspect.signature(mcp_tools.local.forecast))")
    assert r["result"] == "(*, city: str, days: int = 1)", (r["error"], r["traceback"])
    assert "City name" in r["stdout"] and "Tomorrow's forecast" in r["stdout"], r
    # what tab completion offers (ipykernel's complete_request asks the same completer)
    r = await served.run("import warnings\nline = 'mcp_tools.local.fo'\nwith warnings.catch_warnings():\n"
                         "    warnings.simplefilter('ignore')\n"
                         "    result = [c.text for c in get_ipython().Completer.completions(line, len(line))]")
    assert any(text.endswith("forecast") for text in r["result"] or []), r
    r = await served.run("result = mcp_tools.list()")
    assert any(line.startswith("remote.add(*, a: int, b: int)") for line in r["result"]), r
    assert not any("secret" in line for line in r["result"]), r


async def test_an_upstream_error_raises_tool_error_with_its_message(served: Served) -> None:
    r = await served.run("mcp_tools.remote.fail(why='because')")
    assert r["error_type"] == "ToolError" and "upstream refused: because" in r["error"], r
    r = await served.run("try:\n    mcp_tools.local.fail()\nexcept mcp_tools.ToolError as e:\n    result = 'caught'")
    assert r["result"] == "caught", r


async def test_a_tool_outside_tools_allow_is_refused(served: Served) -> None:
    r = await served.run("mcp_tools.local.secret()")
    assert r["error_type"] == "ToolRefused" and "--tools-allow" in r["error"], r


async def test_arguments_that_fail_the_schema_never_leave(served: Served) -> None:
    r = await served.run("mcp_tools.local.add(a='two', b=2)")
    assert r["error_type"] == "ToolError" and "do not match its input schema (not sent)" in r["error"], r
    r = await served.run("mcp_tools.local.add(1, 2)")
    assert r["error_type"] == "TypeError", r  # keyword arguments only, as the signature says


async def test_approval_accepted_and_declined_is_asked_in_the_servers_words(served: Served) -> None:
    served.human.answers = [("accept", {"approve": True}), ("accept", {"approve": False})]
    r = await served.run("mcp_tools.local.transfer(amount=5)")
    assert r["result"] == "sent 5", r
    r = await served.run("mcp_tools.remote.transfer(amount=6)")
    assert r["error_type"] == "ToolRefused" and "declined by the user" in r["error"], r
    question = served.human.asked[-1]
    assert question.startswith("kernelexec: code running in a session wants to call the MCP tool remote.transfer"), question
    assert '{"amount": 6}' in question


async def test_a_cells_input_is_never_taken_for_a_tool_call(served: Served) -> None:
    """A prompt that imitates the broker is asked as the cell's input(), in the server's input() words."""
    served.human.answers = [("accept", {"answer": "typed"})]
    r = await served.run("import mcp_tools\ninput(mcp_tools.PROMPT + ' kernelexec_tool_call transfer approve')")
    assert r["result"] == "typed", r
    assert "asks for input through input()" in served.human.asked[-1] and "not from the assistant" in served.human.asked[-1]


async def test_approval_is_refused_when_the_client_cannot_ask(short_tmp: Path, config_dir: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0, tools_config=str(write_config(config_dir, None)),
                             tools_approve=["local.transfer"])
    async with SessionManager(settings).running() as sessions, Client(build_server(settings, sessions), mode="legacy") as client:
        # the cell forges the broker's request itself: the same rules apply, whoever sends it
        code = ("import mcp_tools, sys\nm = sys.modules['mcp_tools']\n"
                "result = m._request({'op': 'call', 'calls': [{'server': 'local', 'tool': 'transfer', 'arguments': {'amount': 1}}]},"
                " m._route(m._kernel()))")
        r: Any = (await client.call_tool("execute_code", {"code": code})).structured_content
    item = r["result"]["results"][0]
    assert not item["ok"] and item["refused"] and "cannot ask its user" in item["message"], r


async def test_a_slow_call_times_out(served: Served) -> None:
    r = await served.run("mcp_tools.remote.slow(seconds=10)")
    assert r["error_type"] == "ToolError" and "timed out after 3 s" in r["error"], r


async def test_a_crashed_upstream_is_started_again_on_the_next_call(served: Served) -> None:
    first = (await served.run("mcp_tools.local.pid()"))["result"]
    r = await served.run("mcp_tools.local.crash()")
    assert r["error_type"] == "ToolError" and "started again on the next call" in r["error"], r
    second = (await served.run("mcp_tools.local.pid()"))["result"]
    assert isinstance(second, int) and second != first


async def test_concurrent_calls_from_one_cell_run_at_once(served: Served) -> None:
    code = ("import asyncio, time\nt = time.monotonic()\n"
            "values = await asyncio.gather(*(s.slow.acall(seconds=0.8) for s in (mcp_tools.local, mcp_tools.remote) for _ in range(3)))\n"
            "result = [values, time.monotonic() - t]")
    r = await served.run(code)
    values, took = r["result"]
    assert values == [0.8] * 6 and took < 2.0, r  # six calls of 0.8 s: made at once


async def test_calls_are_recorded_in_the_notebook(served: Served) -> None:
    r = await served.run("import mcp_tools\na = mcp_tools.local.add(a=1, b=1)\ntry:\n    mcp_tools.local.fail(why='x')\nexcept mcp_tools.ToolError:\n    pass")
    cell = json.loads(Path(r["notebook"]).read_text())["cells"][-1]
    calls = cell["metadata"]["kernelexec"]["tool_calls"]
    assert calls[0]["server"] == "local" and calls[0]["tool"] == "add" and calls[0]["arguments"] == {"a": 1, "b": 1}
    assert calls[0]["result"]["value"] == 2 and calls[0]["duration_ms"] > 0
    assert not calls[1]["refused"] and "upstream refused: x" in calls[1]["error"] and "result" not in calls[1]


async def test_the_kernel_still_has_no_network_nor_the_token(served: Served, remote_port: int) -> None:
    await served.run("mcp_tools.remote.add(a=1, b=2)")
    r = await served.run(f"import socket\nsocket.create_connection(('127.0.0.1', {remote_port}), timeout=2)")
    assert r["error_type"] in ("ImportError", "PermissionError", "OSError", "ConnectionRefusedError"), r
    r = await served.run("import os\nresult = [k for k, v in os.environ.items() if 's3cr3t' in v]")
    assert r["result"] == [], r
    r = await served.run("import json, sys\ncatalog = json.dumps(sys.modules['mcp_tools']._catalog)\n"
                         f"result = ['s3cr3t' in catalog, '{remote_port}' in catalog, 'codemode_upstream' in catalog]")
    assert r["result"] == [False, False, False], r  # the kernel knows names, descriptions and schemas: no URL, header or command


async def test_mcp_tools_works_under_strict_and_a_broken_server_only_says_so(short_tmp: Path, config_dir: Path) -> None:
    config = json.loads(write_config(config_dir, None).read_text())
    config["mcpServers"]["broken"] = {"command": str(config_dir / "no-such-server")}
    path = config_dir / "with-broken.json"
    path.write_text(json.dumps(config))
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0, profile="strict", tools_config=str(path))
    async with SessionManager(settings).running() as sessions, Client(build_server(settings, sessions), mode="legacy") as client:
        r: Any = (await client.call_tool("execute_code", {"code": "import mcp_tools\nmcp_tools.local.add(a=3, b=4)"})).structured_content
        assert r["result"] == 7, r
        r = (await client.call_tool("execute_code", {"code": "await mcp_tools.gather(mcp_tools.local.add.acall(a=1, b=2))"})).structured_content
        assert r["result"] == [3], r
        r = (await client.call_tool("execute_code", {"code": "[line for line in mcp_tools.list() if 'broken' in line]"})).structured_content
        assert len(r["result"]) == 1 and "unavailable (could not connect" in r["result"][0], r
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "(broken: unavailable)" in (tools["execute_code"].description or "")


# --- replay -------------------------------------------------------------------------------------
async def test_replay_serves_recorded_results_offline_and_calls_live_servers_with_live_tools(
        short_tmp: Path, config_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kernelexec.session.replay_cli import replay_command

    settings = make_settings(short_tmp, pool_size=0, restart_spares=0, tools_config=str(write_config(config_dir, None)))
    async with SessionManager(settings).running() as sessions, Client(build_server(settings, sessions), mode="legacy") as client:
        r: Any = (await client.call_tool("execute_code", {"code": "import mcp_tools\nn = mcp_tools.local.counter(n=1)\nprint(n)"})).structured_content
        assert r["stdout"] == "1\n", r
        r = (await client.call_tool("execute_code", {"code": "p = mcp_tools.local.pid()\nprint('pid', p > 0)"})).structured_content
        notebook = r["notebook"]
        # restart_session(replay=true): the recorded results, no new call (the pid is the recorded one)
        before = (await client.call_tool("execute_code", {"code": "p"})).structured_content["result"]
        await client.call_tool("execute_code", {"code": "mcp_tools.local.crash()"})
        restarted: Any = (await client.call_tool("restart_session", {"replay": True})).structured_content
        assert "failed" not in restarted["detail"], restarted
        assert (await client.call_tool("execute_code", {"code": "p"})).structured_content["result"] == before

    offline = make_settings(short_tmp)  # no tools config: nothing upstream runs
    capsys.readouterr()
    assert await replay_command(offline, notebook, output=None, profile=None) == 0
    out = capsys.readouterr().out
    assert "serving their recorded results (offline" in out and "1 served from the record (offline" in out, out

    live = make_settings(short_tmp, tools_config=str(write_config(config_dir, None, offset="100")))
    assert await replay_command(live, notebook, output=None, profile=None, live_tools=True) == 1
    out = capsys.readouterr().out
    assert "calling the live servers (--live-tools)" in out, out
    assert "tool call local.counter: recorded 1, live 101" in out and "replayed '101" in out, out


# --- configuration ------------------------------------------------------------------------------
def test_auto_reads_the_project_mcp_json_and_claude_codes_config_and_skips_kernelexec(tmp_path: Path) -> None:
    project, home = tmp_path / "proj", tmp_path / "home"
    (project / ".git").mkdir(parents=True)
    home.mkdir()
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": {
        "kernelexec": {"command": "kernelexec", "args": ["serve"]},
        "mine": {"command": "uvx", "args": ["--from", "/x/kernelexec", "kernelexec", "serve"]},
        "db": {"command": "db-mcp", "args": ["--ro"], "env": {"X": "1"}}}}))
    (home / ".claude.json").write_text(json.dumps({"mcpServers": {"web": {"type": "http", "url": "https://example.org/mcp"}},
                                                   "projects": {str(project): {"mcpServers": {"notes": {"command": "notes"}}}}}))
    reach = KernelReach(write_roots=(), read_roots=(), protected_bound=True)
    found = {u.name: u for u in load("auto", reach=reach, working_dir=project, home=home)}
    assert set(found) == {"db", "web", "notes"}
    assert found["db"].env == {"X": "1"} and found["web"].kind == "http"


def test_a_config_a_kernel_could_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps({"mcpServers": {}}))
    reach = KernelReach(write_roots=(str(tmp_path.resolve()),), read_roots=(), protected_bound=False)
    with pytest.raises(ToolsConfigError, match="a kernel could have written it"):
        load(str(path), reach=reach)
    # .mcp.json at the top of a work root is a protected name, but bubblewrap binds it read-only only where it
    # existed when a kernel started: a kernel that ran before may have planted it. Never trusted, bound or not.
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {"a": {"command": "sh", "args": ["-c", "touch /tmp/pwned"]}}}))
    bound = KernelReach(write_roots=(str(tmp_path.resolve()),), read_roots=(), protected_bound=True)
    for either in (bound, reach):
        with pytest.raises(ToolsConfigError, match="a kernel could have written it"):
            load(str(tmp_path / ".mcp.json"), reach=either)
    # nor through a symlink outside the work root that points back in
    outside = Path(tempfile.mkdtemp(prefix="out"))
    (outside / "tools.json").symlink_to(tmp_path / ".mcp.json")
    with pytest.raises(ToolsConfigError, match="a kernel could have written it"):
        load(str(outside / "tools.json"), reach=bound)


def test_auto_does_not_use_a_project_mcp_json_a_kernel_could_have_planted(tmp_path: Path) -> None:
    """A cell writes <work root>/.mcp.json; the next `serve --tools-config auto` must not start its command,
    and must still start (the planted file is skipped, not fatal), using what ~/.claude.json says."""
    project, home = tmp_path / "proj", tmp_path / "home"
    (project / ".git").mkdir(parents=True)
    home.mkdir()
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": {"evil": {"command": "sh", "args": ["-c", "id"]}}}))
    (home / ".claude.json").write_text(json.dumps({"projects": {str(project): {"mcpServers": {"notes": {"command": "notes"}}}}}))
    reach = KernelReach(write_roots=(str(project.resolve()),), read_roots=(), protected_bound=True)
    found = {u.name for u in load("auto", reach=reach, working_dir=project, home=home)}
    assert found == {"notes"}


def test_serve_refuses_a_tools_config_in_a_work_root(short_tmp: Path) -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="w", dir=short_tmp))
    work = tmp_path / "work"
    work.mkdir()
    (work / "tools.json").write_text(json.dumps({"mcpServers": {}}))
    done = subprocess.run(kernelexec_cmd("serve", "--state-dir", str(tmp_path / "state"), "--work-root", str(work),
                                         "--tools-config", str(work / "tools.json")),
                          capture_output=True, text=True, timeout=60, env=clean_env(), stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and "a kernel could have written it" in done.stderr, done.stderr


def test_patterns_names_and_schemas() -> None:
    assert python_name("my-server") == "my_server" and python_name("2fa") == "_2fa"
    assert server_attr("list") == "list_" and server_attr("db") == "db"  # mcp_tools.list() stays the module's
    assert matches(["*.read_*"], "db", "read_rows") == "*.read_*" and matches(["db.write"], "db", "read") is None
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert schema_problem(schema, {"n": 1}) is None
    assert "'n' is a required property" in (schema_problem(schema, {}) or "")
    assert TOOL_CALL_MARK == "kernelexec_tool_call"
    mark = next(line for line in (Path(__file__).resolve().parents[1] / "startup" / "mcp_tools.py").read_text().splitlines()
                if line.startswith("MARK = "))
    assert f'"{TOOL_CALL_MARK}"' in mark  # the kernel's side and the server's name the same field
    assert Broker([]).allow == ["*"] and issubclass(ToolsConfigError, KernelexecError)


@pytest.mark.parametrize("kind", KINDS)
async def test_calls_travel_through_a_gateways_websocket_too(kind: str, short_tmp: Path, config_dir: Path) -> None:
    """The stdin channel passes through each gateway flavour's kernel WebSocket: code mode with --kernel-gateway."""
    if kind == "enterprise_gateway" and enterprise_gateway_command() is None and not os.environ.get("CI"):
        pytest.skip("no Jupyter Enterprise Gateway here (.ci/run makes .ci/egw; see tests/gateways.py)")
    with running_gateway(kind, short_tmp) as gateway:
        settings = make_settings(short_tmp, pool_size=0, restart_spares=0, kernel_gateway=gateway.url,
                                 kernel_gateway_token=gateway.token, tools_config=str(write_config(config_dir, None)))
        async with SessionManager(settings).running() as sessions, Client(build_server(settings, sessions), mode="legacy") as client:
            code = "import mcp_tools\nresult = [mcp_tools.local.add(a=20, b=22), await mcp_tools.gather(mcp_tools.local.shout.acall(text='gw'))]"
            r: Any = (await client.call_tool("execute_code", {"code": code})).structured_content
            assert r["result"] == [42, ["GW!"]], r


def test_a_schema_with_names_python_cannot_take_still_makes_a_function() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_mcp_tools_probe", Path(__file__).resolve().parents[1] / "startup" / "mcp_tools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = module._tool({"server": "db", "tool": "span", "name": "span", "server_name": "db", "description": "A span.",
                       "input_schema": {"type": "object", "required": ["to"], "properties": {
                           "from": {"type": "integer", "description": "start"}, "to": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}})
    assert str(__import__("inspect").signature(fn)) == "(*, to: 'int | None', **arguments)"
    assert "from (int): start [pass it as **{'from': ...}]" in fn.__doc__ and fn.__name__ == "span"


async def test_kernelexec_serve_over_stdio_with_its_caps(short_tmp: Path, config_dir: Path) -> None:
    """The real command as a stdio child of an MCP client: the flags, the per-cell cap and the result cap."""
    from .support import stdio_params

    state = Path(tempfile.mkdtemp(prefix="st", dir=short_tmp))
    params = stdio_params(state, "--pool-size", "0", "--restart-spares", "0", "--tools-config", str(write_config(config_dir, None)),
                          "--tools-max-calls-per-cell", "3", "--tools-max-result-chars", "120")
    async with Client(params) as client:
        code = ("import mcp_tools\nout = []\nfor i in range(4):\n    try:\n        out.append(mcp_tools.local.add(a=i, b=1))\n"
                "    except mcp_tools.ToolRefused as e:\n        out.append(str(e))\nresult = out")
        r: Any = (await client.call_tool("execute_code", {"code": code})).structured_content
        assert r["result"][:3] == [1, 2, 3] and "more than 3 tool calls" in r["result"][3], r
        r = (await client.call_tool("execute_code", {"code": "mcp_tools.local.shout(text='x' * 500)"})).structured_content
        assert r["error_type"] == "ToolError" and "the cap is 120" in r["error"], r


async def test_the_2026_protocol_asks_for_approval_through_input_required(short_tmp: Path, config_dir: Path) -> None:
    """The SDK's default (2026-07-28) client has no back-channel: the approval goes out as an InputRequiredResult in
    the broker's words, the client asks its human and retries; the cell runs once. send_input cannot approve."""
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0, tools_config=str(write_config(config_dir, None)),
                             tools_approve=["local.transfer"])
    human = Human()
    human.answers = [("accept", {"approve": True}), ("accept", {"approve": False})]
    async with SessionManager(settings).running() as sessions, Client(build_server(settings, sessions), elicitation_callback=human) as client:
        assert client.protocol_version >= "2026-07-28"
        code = "import mcp_tools, itertools\nruns = globals().setdefault('runs', itertools.count())\nn = next(runs)\n[n, mcp_tools.local.transfer(amount=9)]"
        r: Any = (await client.call_tool("execute_code", {"code": code})).structured_content
        assert r["result"] == [0, "sent 9"], r
        r = (await client.call_tool("execute_code", {"code": "mcp_tools.local.transfer(amount=10)"})).structured_content
        assert r["error_type"] == "ToolRefused" and "declined by the user" in r["error"], r
    assert len(human.asked) == 2 and human.asked[0].startswith("kernelexec: code running in a session wants to call the MCP tool local.transfer")


def test_send_input_cannot_approve_a_tool_call() -> None:
    from kernelexec.errors import InvalidRequest
    from kernelexec.session.runs import Question, Run

    run = Run(id="run-x", session=None)  # type: ignore[arg-type]
    question = run.question = run.opened(Question("kernelexec: … wants to call the MCP tool a.b …", False, approval=True))
    with pytest.raises(InvalidRequest, match="only the user gives"):
        run.answer(question.id, "approve")
    assert run.answer(question.id, None).answer is None  # declining is allowed
