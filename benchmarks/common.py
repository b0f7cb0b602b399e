"""What the benchmark and the soak share: servers, clients, a raw kernel, and /proc readers (Linux).
Settings, commands and ports come from tests/support.py, the helpers the tests use too."""

from __future__ import annotations

import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from kernelexec.config import Settings
from kernelexec.server.build import build_server
from kernelexec.session.manager import SessionManager
from tests.support import clean_env, free_port, kernelexec_cmd, stdio_params  # noqa: F401 - shared with the tests
from tests.support import make_settings as _make_settings


def log(*parts: Any) -> None:
    """Progress goes to stderr so stdout carries only the results."""
    print(*parts, file=sys.stderr, flush=True)


@contextmanager
def short_tmp(prefix: str = "kxb") -> Iterator[Path]:
    """A short base directory under /tmp: unix socket paths must stay under 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def has_setting(name: str) -> bool:
    """Whether this kernelexec has a setting (the benchmarks run against older and newer trees)."""
    return name in Settings.model_fields


def make_settings(base: Path, **overrides: Any) -> Settings:
    """Settings with a fresh state dir; overrides naming a setting this kernelexec lacks are dropped.
    Warm spares are off unless asked for: a spare started in the background would blur the rows that
    do not measure restarts (``bench_restart`` measures them)."""
    overrides.setdefault("restart_spares", 0)
    return _make_settings(base, **{k: v for k, v in overrides.items() if has_setting(k)})


# --- servers and clients ---------------------------------------------------------------------
@asynccontextmanager
async def in_memory(settings: Settings) -> AsyncIterator[tuple[Client, SessionManager]]:
    """A server in this process behind an in-memory MCP client, as tests/conftest.py builds it."""
    sessions = SessionManager(settings)
    async with sessions.running():
        server = build_server(settings, sessions)
        async with Client(server) as client:
            yield client, sessions


def stdio_server_pid(state_dir: Path) -> int | None:
    """The pid of the ``kernelexec serve`` child this process spawned for ``state_dir`` (the stdio client hides it)."""
    for pid in children(os.getpid()):
        cmd = cmdline(pid)
        if "kernelexec" in cmd and "serve" in cmd and str(state_dir) in cmd:
            return pid
    return None


@asynccontextmanager
async def http_server(state_dir: Path, *args: str, timeout: float = 30.0) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """``kernelexec serve --transport http`` on a free port; yields (url, process)."""
    port = free_port()
    proc = subprocess.Popen(
        kernelexec_cmd("serve", "--transport", "http", "--port", str(port), "--state-dir", str(state_dir), *args),
        env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"HTTP server exited with {proc.returncode}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {port}")
            await anyio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool and return its structured content; a tool error raises."""
    result = await client.call_tool(tool, arguments)
    if result.is_error or result.structured_content is None:
        text = " ".join(getattr(c, "text", "") for c in result.content)
        raise RuntimeError(f"{tool} failed: {text[:500]}")
    return result.structured_content


# --- a plain jupyter_client kernel: the floor ----------------------------------------------------
@asynccontextmanager
async def raw_kernel(base: Path) -> AsyncIterator[tuple[Any, Any]]:
    """A plain ipykernel (ipc transport, no history) through AsyncKernelManager/AsyncKernelClient."""
    from jupyter_client.manager import AsyncKernelManager

    d = Path(tempfile.mkdtemp(prefix="raw", dir=base))
    km = AsyncKernelManager(transport="ipc", connection_file=str(d / "kernel.json"))
    km.ip = str(d / "k")
    kc = None
    try:
        await km.start_kernel(
            extra_arguments=["--HistoryManager.enabled=False"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd=str(d),
        )
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        yield km, kc
    finally:
        if kc is not None:
            kc.stop_channels()
        if km.has_kernel:
            await km.shutdown_kernel(now=True)
        await km._async_cleanup_resources()
        shutil.rmtree(d, ignore_errors=True)


async def raw_execute(kc: Any, code: str, timeout: float = 30.0, **kwargs: Any) -> dict[str, Any]:
    """Send one execute request; wait for its shell reply and its IOPub ``idle`` (what a real caller needs)."""
    msg_id = kc.execute(code, **kwargs)
    deadline = time.monotonic() + timeout
    reply = None
    idle = False
    while reply is None or not idle:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no reply to {code!r}")
        if not idle:
            try:
                msg = await kc.get_iopub_msg(timeout=remaining)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" \
                    and msg["content"]["execution_state"] == "idle":
                idle = True
            continue
        try:
            msg = await kc.get_shell_msg(timeout=remaining)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            reply = msg
    return reply["content"]


# --- /proc -------------------------------------------------------------------------------------
def _status_kb(pid: int | str, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_mb(pid: int | str = "self") -> float | None:
    kb = _status_kb(pid, "VmRSS")
    return None if kb is None else kb / 1024


def pss_mb(pid: int | str = "self") -> float | None:
    """Proportional set size: shared pages split between the processes that map them."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU time the process has used so far."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def fd_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_kinds(pid: int | str = "self") -> dict[str, int]:
    """Open fds by kind (socket, pipe, anon_inode:[eventfd], file path prefix ...), for leak reports."""
    kinds: dict[str, int] = {}
    base = f"/proc/{pid}/fd"
    for name in os.listdir(base):
        try:
            target = os.readlink(f"{base}/{name}")
        except OSError:
            continue
        if target.startswith(("socket:", "pipe:")):
            kind = target.split(":")[0]
        elif target.startswith("anon_inode:"):
            kind = target
        elif target.startswith("/"):
            kind = "file:" + os.path.basename(target)
        else:
            kind = target
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(p) for p in fh.read().split()]
        except OSError:
            continue
    return out


def argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def cmdline(pid: int) -> str:
    return " ".join(argv(pid))


def descendants(pid: int) -> list[int]:
    """All processes below ``pid``, parents before children."""
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = children(todo.pop(0))
        out += kids
        todo += kids
    return out


def is_kernel(pid: int) -> bool:
    """A Python process serving a kernel connection file (ipykernel_launcher, or kernelexec's kernel_main.py),
    as opposed to a wrapper around it (bubblewrap, a shell)."""
    args = argv(pid)
    return bool(args) and os.path.basename(args[0]).startswith("python") and "-f" in args \
        and any(a.endswith(".json") for a in args)


def kernel_pids(server_pid: int | str = "self") -> list[int]:
    """The kernel processes (not their sandbox wrappers) below a server process."""
    pid = os.getpid() if server_pid == "self" else int(server_pid)
    return [p for p in descendants(pid) if is_kernel(p)]


def kernel_pid_below(root: int) -> int:
    """The kernel process itself: ``root`` (what the provisioner started) or, when that is a sandbox
    wrapper such as bubblewrap, the Python process inside it."""
    if is_kernel(root):
        return root
    inside = [p for p in descendants(root) if is_kernel(p)]
    return inside[-1] if inside else root


def tree_rss_mb(root: int) -> float:
    """RSS of a process and everything below it (a kernel plus its wrappers)."""
    return sum(rss_mb(p) or 0 for p in [root, *descendants(root)])


def tree_pss_mb(root: int) -> float:
    """PSS of a process and everything below it: all a session costs (kernel, sandbox wrappers, helpers)."""
    return sum(pss_mb(p) or 0 for p in [root, *descendants(root)])


def session_kernel_pid(sessions: SessionManager, handle: str) -> int:
    """The kernel process of a session in an in-memory server (below its sandbox wrapper, if any)."""
    return kernel_pid_below(session_root_pid(sessions, handle))


def session_root_pid(sessions: SessionManager, handle: str) -> int:
    """The process the session's kernel provisioner started (a wrapper when a sandbox is in use)."""
    return sessions.sessions[handle].kernel.km.provisioner.process.pid
