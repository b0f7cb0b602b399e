"""Helpers the tests and the benchmarks share: settings, servers in memory and as processes, /proc lookups.

No pytest here: ``benchmarks/common.py`` imports this module (``from tests.support import ...``; the
benchmarks run from the repository root, where ``tests`` is a package). The fixtures built on these
helpers live in tests/conftest.py, which re-exports them for the test modules that import them from there.
"""

from __future__ import annotations

import glob
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters

from kernelexec.config import Settings, load_settings
from kernelexec.server.app import App
from kernelexec.server.build import build_server
from kernelexec.session.manager import SessionManager

from .zygote import ForkedServer

# ``pytest --weaken LAYER`` (tests/conftest.py): every in-memory server these helpers start runs with that layer
# removed, so that the security tests can be seen to go red. LAYER: a name --disable-layers accepts, ``uid``
# (no per-kernel uid), ``guard`` (the in-kernel guard refuses nothing; conftest patches the policy), or ``off``
# (--sandbox off and the guard off).
OS_LAYERS = ("landlock", "seccomp", "bubblewrap", "netns", "cgroup")
WEAKEN_CHOICES = (*OS_LAYERS, "uid", "guard", "off")
WEAKEN: str | None = None
# Set for the modules of tests/on_postgres/ (its conftest.py), and for every module under ``pytest --store postgres``
# (tests/conftest.py): every server these helpers start (in memory, stdio, HTTP) keeps its session store in a fresh
# database of the pytest process's real PostgreSQL instead of SQLite; None: SQLite, the default.
STORE_URL: Callable[[], str] | None = None
# Settings every server the tests start gets through its environment, on top of what the test gives it (the in-memory
# servers read it from os.environ, the processes from ``clean_env``); tests/conftest.py fills it per test module.
SERVER_ENV: dict[str, str] = {}


def store_env() -> dict[str, str]:
    """The server process's environment for ``--store postgres`` (KERNELEXEC_STORE, a fresh database); else empty."""
    return {"KERNELEXEC_STORE": STORE_URL()} if STORE_URL is not None else {}


def weakened(overrides: dict[str, Any]) -> dict[str, Any]:
    """The settings ``overrides`` with the ``--weaken`` layer removed (unchanged without ``--weaken``)."""
    if WEAKEN is None or WEAKEN == "guard":
        return overrides
    if WEAKEN == "off":
        return overrides | {"sandbox": "off"}
    if WEAKEN == "uid":
        return overrides | {"kernel_uids": False}
    return overrides | {"disable_layers": sorted({*overrides.get("disable_layers", ()), WEAKEN})}


def make_settings(base: Path, **overrides: Any) -> Settings:
    state = Path(tempfile.mkdtemp(prefix="s", dir=base))
    if STORE_URL is not None and "store" not in overrides:
        overrides = overrides | {"store": STORE_URL()}
    return load_settings(state_dir=state, **weakened(overrides))


class Harness:
    """A running server with an in-memory client; ``call`` returns (structured, result)."""

    def __init__(self, client: Client, sessions: SessionManager, settings: Settings, app: App) -> None:
        self.client = client
        self.sessions = sessions
        self.settings = settings
        self.app = app

    async def call(self, tool: str, **arguments: Any) -> Any:
        return await self.client.call_tool(tool, arguments)

    async def run(self, code: str, **arguments: Any) -> dict[str, Any]:
        result = await self.client.call_tool("execute_code", {"code": code, **arguments})
        assert not result.is_error, result.content
        assert result.structured_content is not None
        return result.structured_content

    async def new_session(self, **arguments: Any) -> str:
        result = await self.client.call_tool("new_session", arguments)
        assert not result.is_error, result.content
        return result.structured_content["session"]


async def start_harness(settings: Settings):
    sessions = SessionManager(settings)
    cm = sessions.running()
    await cm.__aenter__()
    app = App(settings, sessions)
    server = build_server(settings, sessions, app)
    client = Client(server)
    await client.__aenter__()
    return Harness(client, sessions, settings, app), cm


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[Harness]:
    """A server with these settings and an in-memory client, torn down on exit."""
    h, cm = await start_harness(settings)
    try:
        yield h
    finally:
        await h.client.__aexit__(None, None, None)
        await cm.__aexit__(None, None, None)


async def until(predicate: Any, what: str, timeout: float = 30) -> None:
    """Wait (bounded) until ``predicate()`` holds: the synchronisation a test does before a check, instead of a
    fixed sleep that on a loaded machine passes by missing the event."""
    import anyio

    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)
    assert predicate(), what


PORT_SLICE = 400  # ports a process hands out, in turn, before it starts over


def _port_slice() -> range:
    """This process's own ports: below (or above) the kernel's ephemeral range, which every outgoing connection's
    local end and every bind to port 0 (jupyter_client's kernel ports, ZeroMQ's) draws from, and apart from every
    other test process's: an xdist worker's by its number, any other process (the weakened red team beside the main
    pass, a benchmark) by its pid."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    slot = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 16 + os.getpid() % 8
    start = low - 24 * PORT_SLICE if low - 24 * PORT_SLICE >= 1024 else high + 1
    first = start + (slot % 24) * PORT_SLICE
    return range(first, min(first + PORT_SLICE, 65536))


_handed_out = os.getpid()  # where in its slice a process starts: two processes sharing a slice start apart


def free_port() -> int:
    """A loopback port free now, that no other test process hands out and no ephemeral bind takes before the
    caller's server binds it. The kernel's own choice (bind to port 0) came from the ephemeral range, where another
    worker's server, kernel or mere outgoing connection could take it in between: a test then talked to the wrong
    server (a JSON-RPC -32603 at initialize from another test's server that refused its token) or its server did not
    start."""
    global _handed_out
    ports = _port_slice()
    for _ in range(len(ports)):
        port = ports[_handed_out % len(ports)]
        _handed_out += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use (a server of this process still running, or a TIME_WAIT): the next one
                continue
            return port
    raise RuntimeError(f"no free port in {ports}")


def wait_for_port(port: int, proc: subprocess.Popen[bytes] | ForkedServer, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port}")


def kernelexec_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kernelexec", *args]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELEXEC_")}
    env.update(SERVER_ENV)
    env.update(extra)
    return env


def stdio_params(state_dir: Path, *args: str) -> StdioServerParameters:
    """``kernelexec serve`` as a stdio child of an MCP client, with this state directory and these flags."""
    cmd = kernelexec_cmd("serve", "--state-dir", str(state_dir), *args)
    return StdioServerParameters(command=cmd[0], args=cmd[1:], env=clean_env(**store_env()))


def pids_with(marker: str) -> list[int]:
    """Processes whose command line contains ``marker`` (a session directory, a connection file, a kernel id)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def stop(proc: subprocess.Popen[bytes] | ForkedServer, grace: float = 10) -> None:
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)


@contextmanager
def http_server(state_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 30) -> Iterator[str]:
    """``kernelexec serve --transport http`` as a real process on a free loopback port (``env`` added to its
    environment); yields its /mcp URL."""
    with served(state_dir, *args, env=env, timeout=timeout) as server:
        yield server.url


@dataclass
class Served:
    """A running HTTP server: its /mcp URL and its process."""

    url: str
    process: ForkedServer


@contextmanager
def served(state_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 30) -> Iterator[Served]:
    """``http_server``, with the server's process (forked from this process's zygote, tests/zygote.py: the same
    ``kernelexec serve``, without ~1.2 s of imports each)."""
    port = free_port()
    with tempfile.TemporaryFile() as log, open(os.devnull, "wb") as null:
        proc = ForkedServer(["serve", "--transport", "http", "--port", str(port), "--state-dir", str(state_dir), *args],
                            env=clean_env(**store_env(), **(env or {})), stdout=null, stderr=log)
        try:
            wait_for_port(port, proc, timeout)
            yield Served(f"http://127.0.0.1:{port}/mcp", proc)
        except BaseException as exc:  # the server's own words go with the failure (a 500's traceback, say)
            stop(proc)
            log.seek(0)
            exc.add_note("the server's stderr, its end:\n" + log.read()[-6000:].decode(errors="replace"))
            raise
        finally:
            stop(proc)


# --- a real package index on 127.0.0.1 (installs: tests/test_packages.py, benchmarks/packages.py) -----------
def build_wheel(dest: Path, name: str, version: str, body: str, requires: list[str] | None = None,
                tag: str = "py3-none-any") -> Path:
    """A real, minimal wheel (PEP 427), written directly: a module, METADATA, WHEEL, RECORD; pure Python
    whatever ``tag`` (e.g. "cp313-cp313-manylinux2014_x86_64") says, which is all pip looks at."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires or [])
    files = {
        f"{name}/__init__.py": body,
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: kernelexec-tests\nRoot-Is-Purelib: true\nTag: {tag}\n",
        f"{info}/top_level.txt": f"{name}\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel



def build_sdist(dest: Path, name: str, version: str, setup_py: str) -> Path:
    """An sdist-only release (a tar.gz with a setup.py and PKG-INFO)."""
    import io
    import tarfile

    path = dest / f"{name}-{version}.tar.gz"
    pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    with tarfile.open(path, "w:gz") as tar:
        for member, text in ((f"{name}-{version}/setup.py", setup_py), (f"{name}-{version}/PKG-INFO", pkg_info)):
            data = text.encode()
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@contextmanager
def package_index(root: Path, files: list[Path], log: Path | None = None) -> Iterator[str]:
    """A PEP 503 simple index of ``files`` served by a real HTTP server on 127.0.0.1; yields its URL.
    With ``log``, the server's request log (one line per request, with its path) is written there."""
    simple = root / "simple"
    projects: dict[str, list[Path]] = {}
    for path in files:
        projects.setdefault(re.sub(r"[-_.]+", "-", path.name.split("-")[0]).lower(), []).append(path)
    for project, paths in projects.items():
        folder = simple / project
        folder.mkdir(parents=True, exist_ok=True)
        for path in paths:
            (folder / path.name).write_bytes(path.read_bytes())
        (folder / "index.html").write_text("<html><body>" + "".join(f'<a href="{p.name}">{p.name}</a>' for p in paths) + "</body></html>")
    (simple / "index.html").write_text("".join(f'<a href="{p}/">{p}</a>' for p in projects))
    port = free_port()
    log_file = open(log, "ab") if log is not None else None  # noqa: SIM115 - closed below, after the server
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port), "--directory", str(root)],
                              stdout=subprocess.DEVNULL, stderr=log_file or subprocess.DEVNULL)
    try:
        wait_for_port(port, server)
        yield f"http://127.0.0.1:{port}/simple"
    finally:
        stop(server)
        if log_file is not None:
            log_file.close()


def pyenv_python(minor: str) -> str | None:
    """A pyenv interpreter of this minor version (e.g. "3.12"), or None."""
    roots = []
    try:
        roots.append(subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=10).stdout.strip())
    except OSError:
        pass
    roots.append(os.path.expanduser("~/.pyenv"))
    for root in filter(None, roots):
        for path in sorted(glob.glob(f"{root}/versions/{minor}.*/bin/python{minor}")):
            if os.access(path, os.X_OK):
                return path
    return None
