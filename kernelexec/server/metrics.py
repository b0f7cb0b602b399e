"""Prometheus metrics (``prometheus-client``): one registry per server, never the library's global default, so
several servers in one process (the tests) keep apart.

Served at ``/metrics`` on the MCP port over HTTP: behind the bearer token when tokens are configured (a request
without a valid one gets 401); without tokens the server listens on loopback only (cli.py refuses otherwise) and
``/metrics`` answers only requests whose Host names loopback (the DNS-rebinding rule of ``/mcp``). ``--metrics-port``
serves the same page on 127.0.0.1 alone, without a token, under either transport.

What is counted, and where from:
- a scrape reads the live state: sessions, kernels by state, each kernel's resident memory (host-side, from
  /proc/<pid>/status of the kernel process the backend started and its descendants);
- the runs' observer (``RunRegistry.observers``): runs by ending, the queue wait (the run's start to its code
  going to the kernel), each cell's CPU seconds, code mode's broker calls by outcome;
- a middleware: every tool call's latency, by tool and outcome; install_packages calls by outcome;
- the session store's calls, timed by operation (``time_store``).
"""

from __future__ import annotations

import functools
import hmac
import inspect
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from kernelexec.server.auth import LOOPBACK

if TYPE_CHECKING:
    from kernelexec.session.manager import SessionManager
    from kernelexec.session.runs import Run
    from kernelexec.session.session import Session

KERNEL_STATES = ("starting", "busy", "idle", "dead")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    """The server's metrics, in its own registry."""

    def __init__(self) -> None:
        self.tool_names: frozenset[str] = frozenset()  # the server's tools (build_server sets them): the only labels
        self.registry = CollectorRegistry()
        r = self.registry
        self.runs = Counter("kernelexec_runs", "Cell runs by how they ended: ok, error, interrupted, restarted, kernel_died, "
                            "cancelled, failed (the server could not run it), lost (the server stopped first)", ["ending"], registry=r)
        self.calls = Histogram("kernelexec_call_seconds", "Latency of MCP tool calls, by tool and outcome (ok, error)",
                               ["tool", "outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("kernelexec_queue_wait_seconds", "From a cell's run starting to its code going to the "
                                    "kernel (the session's earlier cells, a kernel start, pip lines), by tool",
                                    ["tool"], buckets=LATENCY_BUCKETS, registry=r)
        self.cell_cpu = Counter("kernelexec_cell_cpu_seconds", "CPU seconds the cells used in their kernels, as each kernel "
                                "measured its own cells", registry=r)
        self.installs = Counter("kernelexec_installs", "install_packages calls by outcome (ok, error)", ["outcome"], registry=r)
        self.broker_calls = Counter("kernelexec_broker_calls", "Code mode: tool calls cells made through the broker, by "
                                    "outcome (ok, error, refused)", ["outcome"], registry=r)
        self.store = Histogram("kernelexec_store_seconds", "Latency of the session store's calls, by operation",
                               ["operation"], buckets=STORE_BUCKETS, registry=r)
        self._sessions: SessionManager | None = None

    def watch(self, sessions: SessionManager) -> None:
        """Count ``sessions``: its live state at each scrape, its runs as they end, its store's calls."""
        self._sessions = sessions
        self.registry.register(_Live(sessions))
        sessions.runs.observers.append(self.observe_run)
        if sessions.store is not None:
            time_store(sessions.store, self.store)

    def page(self) -> bytes:
        return generate_latest(self.registry)

    # --- runs --------------------------------------------------------------------------------
    async def observe_run(self, run: Run, event: str) -> None:
        if event != "finished":
            return
        finished = run.finished
        ex = finished.execution if finished is not None else None
        self.runs.labels(ending=run_ending(run)).inc()
        if ex is None:
            return
        if ex.started is not None:
            tool = "execute_code" if run.wait_for_input else "run_python"  # run_python's runs never wait for input
            self.queue_wait.labels(tool=tool).observe(max(ex.started - run.started, 0.0))
        if ex.cpu_seconds is not None:
            self.cell_cpu.inc(ex.cpu_seconds)
        for call in ex.tool_calls:  # broker.CellCalls' records: an error, refused or not, or a result
            outcome = "ok" if "error" not in call else "refused" if call.get("refused") else "error"
            self.broker_calls.labels(outcome=outcome).inc()

    # --- tool calls --------------------------------------------------------------------------
    async def middleware(self, ctx: Any, call_next: Any) -> Any:
        """Every tools/call timed, by tool and outcome; install_packages counted by outcome."""
        if ctx.method != "tools/call":
            return await call_next(ctx)
        params = ctx.params
        name = params.get("name") if isinstance(params, dict) else getattr(params, "name", None)
        # a label only for a tool this server has: a caller's made-up names never become series (memory)
        tool = name if isinstance(name, str) and name in self.tool_names else "unknown"
        started = time.monotonic()
        outcome = "error"
        try:
            result = await call_next(ctx)
            failed = result.get("isError") if isinstance(result, dict) else getattr(result, "is_error", False)
            outcome = "error" if failed else "ok"
            return result
        finally:
            self.calls.labels(tool=tool, outcome=outcome).observe(time.monotonic() - started)
            if tool == "install_packages":
                self.installs.labels(outcome=outcome).inc()


def run_ending(run: Run) -> str:
    ex = run.finished.execution if run.finished is not None else None
    if (run.scope is not None and run.scope.cancelled_caught) or (ex is not None and ex.cancelled):
        return "cancelled"
    if ex is None:
        return "failed" if run.failure is not None else "lost"
    if ex.success:
        return "ok"
    return "error" if ex.ending == "completed" else ex.ending


# --- the store ----------------------------------------------------------------------------------
def time_store(store: Any, histogram: Histogram) -> None:
    """Time each of ``store``'s public coroutine methods (its own instance's, shadowed: the class is untouched)."""
    for name, _ in inspect.getmembers(type(store), inspect.iscoroutinefunction):
        if name.startswith("_") or name == "close":
            continue
        setattr(store, name, _timed(getattr(store, name), histogram.labels(operation=name)))


def _timed(method: Callable[..., Any], child: Any) -> Callable[..., Any]:
    @functools.wraps(method)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return await method(*args, **kwargs)
        finally:
            child.observe(time.monotonic() - started)

    return timed


# --- the live state, read at each scrape --------------------------------------------------------
def kernel_state(session: Session) -> str | None:
    kernel = session.kernel
    if kernel is None:
        return "starting" if session.busy else None  # busy without a kernel: ensure_kernel is starting one
    if kernel.exit_code() is not None:
        return "dead"
    return "busy" if session.busy else "idle"


def kernel_pid(session: Session) -> int | None:
    """The pid of the kernel process the backend started (local kernels; None for remote ones)."""
    km = getattr(session.kernel, "km", None)
    process = getattr(getattr(km, "provisioner", None), "process", None)
    pid = getattr(process, "pid", None)
    return pid if isinstance(pid, int) else None


def _parents() -> dict[int, list[int]]:
    """Each process's children, from /proc/<pid>/stat (the field after the command name, which may hold anything)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_rss(pid: int, children: dict[int, list[int]]) -> int:
    """Resident bytes of ``pid`` and its descendants (a sandboxed kernel runs under bubblewrap's processes)."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _rss(p)
        todo.extend(children.get(p, ()))
    return total


class _Live:
    """A custom collector: the sessions and their kernels as they are at the scrape."""

    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions

    def describe(self) -> list[Metric]:
        return []  # read at each scrape only

    def collect(self) -> Iterator[Metric]:
        sessions = [s for s in list(self.sessions.sessions.values()) if not s.closed]
        yield GaugeMetricFamily("kernelexec_sessions", "Live sessions (holding or about to start a kernel)",
                                value=self.sessions.live_count())
        kernels = GaugeMetricFamily("kernelexec_kernels", "Session kernels by state (starting, busy, idle, dead)", labels=["state"])
        counts = dict.fromkeys(KERNEL_STATES, 0)
        pids = []
        for session in sessions:
            state = kernel_state(session)
            if state is not None:
                counts[state] += 1
            pid = kernel_pid(session) if state in ("busy", "idle") else None
            if pid is not None:
                pids.append(pid)
        for state, n in counts.items():
            kernels.add_metric([state], n)
        yield kernels
        memory = GaugeMetricFamily("kernelexec_kernel_memory_bytes", "Resident memory of each local session kernel (its "
                                   "process and descendants, from /proc), by the pid the server started", labels=["pid"])
        if pids:
            children = _parents()
            for pid in pids:
                memory.add_metric([str(pid)], tree_rss(pid, children))
        yield memory


# --- the page --------------------------------------------------------------------------------------
def endpoint(metrics: Metrics, tokens: list[str]) -> Callable[[Request], Any]:
    """``/metrics`` on the MCP port: with tokens, only for a request bearing one (401 otherwise, nothing read);
    without, only for a Host naming loopback (the server listens on loopback alone then)."""
    known = [t.encode() for t in tokens]

    async def page(request: Request) -> Response:
        if known:
            scheme, _, offered = request.headers.get("authorization", "").partition(" ")
            ok = False
            for token in known:  # constant time, every token compared
                ok |= scheme.lower() == "bearer" and hmac.compare_digest(offered.strip().encode(), token)
            if not ok:
                return Response("a bearer token is required\n", status_code=401, headers={"WWW-Authenticate": "Bearer"},
                                media_type="text/plain")
        elif _host_name(request.headers.get("host", "")) not in LOOPBACK:
            return Response("Invalid Host header\n", status_code=421, media_type="text/plain")
        return Response(metrics.page(), media_type=CONTENT_TYPE_LATEST)

    return page


def _host_name(host: str) -> str:
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def loopback_app(metrics: Metrics) -> Any:
    """``--metrics-port``: a Starlette app serving ``/metrics`` alone, for 127.0.0.1, without a token."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    return Starlette(routes=[Route("/metrics", endpoint(metrics, []), methods=["GET"])])
