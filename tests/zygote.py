"""``kernelexec serve`` processes forked from a zygote that has imported the server once, for the tests' many
HTTP servers and fleet replicas.

Why: a server's start is ~1.2 s of CPU, almost all of it imports (the MCP SDK, pydantic's models, uvicorn); a test
pass starts ~110 HTTP servers, on a 2-core machine where the pass is CPU-bound. A forked server runs the same
``kernelexec.cli.main`` with its own argv, environment, working directory and output, and starts in ~0.1 s of CPU.
What it does not show is the exec'd start itself; the tests that judge that (``tests/test_cli.py``, the refusals
in ``tests/test_auth.py``, ``tests/test_restart.py``, the stdio servers every client starts) exec
``python -m kernelexec`` as a user does.

One zygote per test process (``zygote()``), spoken to over a Unix socket pair: a request carries the argv, the
environment, the working directory and the stdout/stderr descriptors (SCM_RIGHTS); the answer carries the child's
pid and a pidfd of it, opened before the zygote can reap it, so a signal can never reach a reused pid. The zygote
reaps its children and reports each one's exit status, so ``ForkedServer`` answers ``poll``/``wait`` as
``subprocess.Popen`` does (a negative signal number for a killed one).

Only the standard library at module level: the zygote imports this module before anything else.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
PRELOAD = ("kernelexec.cli", "kernelexec.server.build", "kernelexec.session.manager", "uvicorn")
MAX_MESSAGE = 1 << 20


# --- the zygote's side ---------------------------------------------------------------------------------------
def serve_forks(fd: int) -> None:
    """The zygote: import what a server imports, then fork a server for each request on socket ``fd`` until it
    closes, reporting each child's exit."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    assert threading.active_count() == 1, threading.enumerate()  # fork copies only this thread
    control = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes the wakeup fd
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)

    def send(message: dict[str, Any], fds: list[int] | None = None) -> None:
        socket.send_fds(control, [json.dumps(message).encode()], fds or [])

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    while True:
        for key, _ in selector.select():
            if key.fileobj == wake_r:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                reap()
                continue
            try:
                data, fds, _flags, _addr = socket.recv_fds(control, MAX_MESSAGE, 2)
            except InterruptedError:
                continue
            if not data:
                return  # the test process is gone
            request = json.loads(data)
            pid = os.fork()
            if pid == 0:
                selector.close()
                control.close()
                os.close(wake_r)
                os.close(wake_w)
                _run_server(request, fds)  # never returns
            for descriptor in fds:
                os.close(descriptor)
            pidfd = os.pidfd_open(pid)  # before any reap: it names this child, never a reused pid
            send({"pid": pid, "id": request["id"]}, [pidfd])
            os.close(pidfd)


def _run_server(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become ``kernelexec <argv>`` with the request's environment, directory and output. It
    ends by raising SystemExit through ``serve_forks``, so the interpreter shuts down as a started one does (its
    non-daemon threads joined, atexit run): a server that would hang at its exit hangs here too."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for descriptor in {null, *fds} - {0, 1, 2}:
            os.close(descriptor)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["kernelexec", *request["argv"]]
        import kernelexec.cli

        kernelexec.cli.main(request["argv"])
        code = 0
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    raise SystemExit(code)


# --- the test's side -----------------------------------------------------------------------------------------
class Zygote:
    """The process this test process forks its servers from (``serve_forks``)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        source = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.zygote import serve_forks; serve_forks({theirs.fileno()})"
        env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELEXEC_")}
        self.proc = subprocess.Popen([sys.executable, "-c", source], pass_fds=[theirs.fileno()], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=ROOT)
        theirs.close()
        self.control = ours
        self.lock = threading.Lock()
        self.exits: dict[int, int] = {}
        self.requests = 0

    def _receive(self, timeout: float | None) -> tuple[dict[str, Any], list[int]] | None:
        """One message (None when ``timeout`` passed first); an exit report is kept in ``exits``. Under ``lock``."""
        self.control.settimeout(timeout)
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.control, MAX_MESSAGE, 1)
        except TimeoutError:
            return None
        for descriptor in fds:
            os.set_inheritable(descriptor, False)  # recv_fds leaves them inheritable
        if not data:
            raise RuntimeError(f"the server zygote exited with {self.proc.wait(15)} (its error is in the test's output)")
        message = json.loads(data)
        if "exit" in message:
            self.exits[message["exit"]] = message["code"]
        return message, fds

    def fork(self, argv: list[str], env: dict[str, str], stdout: int, stderr: int) -> tuple[int, int]:
        """A server running ``kernelexec <argv>``: its pid and a pidfd of it."""
        with self.lock:
            self.requests += 1
            request = {"argv": argv, "env": env, "cwd": os.getcwd(), "id": self.requests}
            socket.send_fds(self.control, [json.dumps(request).encode()], [stdout, stderr])
            while True:
                received = self._receive(120)
                if received is None:
                    raise TimeoutError("the server zygote did not answer a fork in 120 s")
                message, fds = received
                if "pid" not in message:
                    continue
                if message["id"] == request["id"]:
                    return message["pid"], fds[0]
                signal.pidfd_send_signal(fds[0], signal.SIGKILL)  # a late answer to a fork that timed out:
                os.close(fds[0])  # that server was never handed out

    def exit_code(self, pid: int, timeout: float) -> int | None:
        """``pid``'s exit code once the zygote reported it (within ``timeout`` s), else None."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while pid not in self.exits:
                left = deadline - time.monotonic()
                if left <= 0 or self._receive(left) is None:
                    return None
            return self.exits.pop(pid)


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def zygote() -> Zygote:
    """This test process's zygote, started at first use."""
    global _zygote
    with _zygote_lock:
        if _zygote is None or _zygote.proc.poll() is not None:
            _zygote = Zygote()
        return _zygote


def _ended(pidfd: int, timeout: float | None) -> bool:
    """Whether the process of ``pidfd`` has ended (a pidfd is readable once it has), waiting up to ``timeout`` s."""
    import select

    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, timeout) * 1000))


class ForkedServer:
    """``kernelexec <argv>`` forked from this process's zygote, answering as much of ``subprocess.Popen`` as the
    tests use: ``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``."""

    def __init__(self, argv: list[str], env: dict[str, str], stdout: IO[Any] | int, stderr: IO[Any] | int | None = None) -> None:
        out = stdout if isinstance(stdout, int) else stdout.fileno()
        err = out if stderr is None else stderr if isinstance(stderr, int) else stderr.fileno()
        self.args = ["kernelexec", *argv]
        self.zygote = zygote()
        self.pid, self.pidfd = self.zygote.fork(argv, env, out, err)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and _ended(self.pidfd, 0):
            self._collect(15)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not _ended(self.pidfd, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._collect(15)
        assert self.returncode is not None
        return self.returncode

    def _collect(self, timeout: float) -> None:
        code = self.zygote.exit_code(self.pid, timeout)
        if code is None:
            raise RuntimeError(f"server {self.pid} ended but its zygote reported no exit status in {timeout} s")
        self.returncode = code
        os.close(self.pidfd)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self.pidfd, sig)
            except ProcessLookupError:
                pass  # ended, not yet collected: as Popen, no error

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
