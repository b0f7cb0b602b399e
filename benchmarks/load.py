"""Load test: many MCP clients at once against one ``kernelexec serve --transport http`` with bearer tokens.

    python -m benchmarks.load [--clients 20] [--calls 100] [--tokens 2] [--pool-size 4] [--quick] [--json FILE]

One server subprocess on 127.0.0.1 with a token file of ``--tokens`` bearer tokens (client ``i`` uses
token ``i % tokens``), ``--max-sessions`` and ``--max-sessions-per-token`` raised to fit every client,
and a warm pool of ``--pool-size`` kernels. Each client is its own ``mcp.Client`` over streamable HTTP
(its own HTTP connection pool and Authorization header), opens its own session with ``new_session``
and passes that handle on every call. Setup binds a random ``secret`` and ``counter = 0``; then, once
every client is ready, all of them run ``--calls`` cells as fast as answers come back, about 80 %
quick (``counter += 1``) and 20 % slow (``time.sleep(0.2)``, or a numpy sum of squares), each also
incrementing the counter and returning ``[counter, secret, ...]``.

Checked on every answer: success, the answer's ``session`` is the client's handle, the counter is the
next one, the secret is the client's own, the numpy sum is exact. At the end each session must hold
its own secret and ``counter == calls``. Meanwhile an intruder (client 0's connection, so its token)
tries every session of the other token(s) with execute_code, list_variables and close_session: each
must be a tool error saying "unknown session" and must not carry the victim's secret. Requests with
no token or a wrong one must get HTTP 401.

Reported: throughput (calls/s over the call phase), p50/p95/p99 latency per cell kind (and the same
cells from one client alone on the same server before the load, as the baseline), new_session
latency, errors, and the server's RSS and open fds before, at peak and after the sessions are closed.
Exit status 1 on any wrong answer, leak, error or unexpected refusal; 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # ``python benchmarks/load.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from benchmarks.common import (
    clean_env,
    cpu_seconds,
    descendants,
    fd_count,
    fd_kinds,
    free_port,
    kernel_pids,
    kernelexec_cmd,
    log,
    rss_mb,
    short_tmp,
    tree_rss_mb,
)
from benchmarks.stats import Measurement, percentile, render_grid, table

MS = "ms"
CALL_DEADLINE = 180.0  # seconds one call may take before it counts as an error (bounded, never hangs)
SLEEP_S = 0.2
NUMPY_N = 200_000
NUMPY_SUM = float(sum(i * i for i in range(NUMPY_N)))  # < 2**53 and every partial sum is an integer: exact in float64

SETUP = "secret = {secret!r}\ncounter = 0\nimport time\nimport numpy as np"
CODES = {
    "quick": "counter += 1\nresult = [counter, secret]",
    "sleep": f"time.sleep({SLEEP_S})\ncounter += 1\nresult = [counter, secret]",
    "numpy": f"_a = np.arange({NUMPY_N}, dtype=np.float64)\ncounter += 1\nresult = [counter, secret, float((_a * _a).sum())]",
}
FINAL = "result = {'secret': secret, 'counter': counter}"
KIND_LABEL = {"quick": "quick (counter += 1)", "sleep": f"slow: time.sleep({SLEEP_S})", "numpy": f"slow: numpy sum of {NUMPY_N:,} squares"}


@dataclass
class Results:
    latency: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in CODES})
    alone: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in CODES})
    new_session: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # wrong answers, leaks, errors: any makes the exit status 1
    errors: int = 0  # calls that raised or were unexpected tool errors
    wrong: int = 0   # answers that came back but were not what the cell must produce
    leaks: int = 0   # another session's secret seen, or another token's handle accepted
    intrusions: int = 0  # cross-token attempts made (each must be refused)
    done: int = 0
    peak_rss: float = 0.0
    peak_fds: int = 0
    last_end: float = 0.0  # perf_counter when the last client's last call was answered

    def fail(self, kind: str, message: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.failures) < 200:
            self.failures.append(f"{kind}: {message}")


def ms(seconds: float) -> float:
    return seconds * 1000


def text_of(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


@asynccontextmanager
async def mcp_client(url: str, token: str) -> AsyncIterator[Client]:
    """An MCP client over streamable HTTP with its own connection pool; the pool is closed with it
    (the SDK leaves a caller's httpx client open, and its keep-alive sockets would count as server fds)."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=CALL_DEADLINE) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def plan_kinds(calls: int, slow_share: float, rng: random.Random) -> list[str]:
    """``calls`` kinds, ``slow_share`` of them slow (half sleep, half numpy), in a shuffled order."""
    slow = round(calls * slow_share)
    kinds = ["quick"] * (calls - slow) + ["sleep"] * (slow - slow // 2) + ["numpy"] * (slow // 2)
    rng.shuffle(kinds)
    return kinds


# --- the server --------------------------------------------------------------------------------------
class Server:
    def __init__(self, base: Path, args: argparse.Namespace, tokens: list[str]) -> None:
        self.base = base
        self.tokens = tokens
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log_path = base / "server.log"
        token_file = base / "tokens"
        token_file.write_text("# benchmarks.load: one bearer token per line\n" + "".join(t + "\n" for t in tokens))
        token_file.chmod(0o600)
        per_token = -(-args.clients // len(tokens)) + 2  # its clients, the alone-baseline session, slack
        self.cmd = kernelexec_cmd(
            "serve", "--transport", "http", "--host", "127.0.0.1", "--port", str(self.port),
            "--state-dir", str(base / "state"), "--auth-token-file", str(token_file),
            "--max-sessions", str(args.clients + args.pool_size + 4), "--max-sessions-per-token", str(per_token),
            "--pool-size", str(args.pool_size), "--idle-timeout", "0",
        )
        self.proc: subprocess.Popen[bytes] | None = None

    async def __aenter__(self) -> Server:
        import socket

        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, env=clean_env(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {self.port}:\n{self.log_tail()}")
            await anyio.sleep(0.05)

    async def __aexit__(self, *exc: Any) -> None:
        assert self.proc is not None
        self.proc.terminate()
        try:
            await anyio.to_thread.run_sync(self.proc.wait, 30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def sample(self) -> dict[str, Any]:
        kernels = kernel_pids(self.pid)
        return {
            "rss_mb": rss_mb(self.pid) or 0.0,
            "fds": fd_count(self.pid),
            "fd_kinds": fd_kinds(self.pid),
            "kernels": len(kernels),
            "tree_rss_mb": tree_rss_mb(self.pid),
        }

    async def wait_kernels(self, want: int, timeout: float = 180.0) -> bool:
        """Wait until the server has ``want`` kernel processes (the pool filled, or drained back to it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(kernel_pids(self.pid)) == want:
                return True
            await anyio.sleep(0.2)
        return False


# --- one client ---------------------------------------------------------------------------------------
def check_answer(res: Results, who: str, r: Any, handle: str, expect: int, secret: str, kind: str) -> None:
    if r.is_error or r.structured_content is None:
        res.fail("errors", f"{who}: {kind} call #{expect} was a tool error: {text_of(r)[:300]}")
        return
    s = r.structured_content
    if not s.get("success"):
        res.fail("wrong", f"{who}: {kind} call #{expect} failed: {s.get('error')}")
        return
    if s.get("session") != handle:
        res.fail("leaks", f"{who}: answer names session {s.get('session')!r}, not {handle!r}")
    value = s.get("result")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if not isinstance(value, list) or len(value) < 2:
        res.fail("wrong", f"{who}: {kind} call #{expect}: result {value!r}")
        return
    if value[1] != secret:
        res.fail("leaks", f"{who}: {kind} call #{expect}: secret {str(value[1])[:12]!r}... is not this session's")
    if value[0] != expect:
        res.fail("wrong", f"{who}: {kind} call #{expect}: counter is {value[0]!r}")
    if kind == "numpy" and (len(value) < 3 or value[2] != NUMPY_SUM):
        res.fail("wrong", f"{who}: numpy call #{expect}: sum {value[2:]!r} != {NUMPY_SUM!r}")


async def timed_call(client: Client, tool: str, args: dict[str, Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    with anyio.fail_after(CALL_DEADLINE):
        r = await client.call_tool(tool, args)
    return r, ms(time.perf_counter() - t0)


@dataclass
class Handle:
    index: int
    token_index: int
    handle: str = ""
    secret: str = ""


async def run_client(i: int, args: argparse.Namespace, server: Server, res: Results, me: Handle, everyone: list[Handle],
                     ready: list[int], go: anyio.Event, finished: list[int]) -> None:
    who = f"client {i:02d}"
    token = server.tokens[me.token_index]
    kinds = plan_kinds(args.calls, args.slow_share, random.Random(args.seed * 1000 + i))
    counted = False
    try:
        async with mcp_client(server.url, token) as client:
            try:
                r, t = await timed_call(client, "new_session", {})
                if r.is_error:
                    res.fail("errors", f"{who}: new_session refused: {text_of(r)[:300]}")
                    return
                res.new_session.append(t)
                me.handle = r.structured_content["session"]
                r, _ = await timed_call(client, "execute_code", {"code": SETUP.format(secret=me.secret), "session": me.handle})
                if r.is_error or not r.structured_content.get("success"):
                    res.fail("errors", f"{who}: setup failed: {text_of(r)[:300]}")
                    return
            finally:
                ready[0] += 1
                counted = True
            await go.wait()
            async with anyio.create_task_group() as tg:
                if i == 0:
                    tg.start_soon(intrude, client, me, everyone, res, args)
                for n, kind in enumerate(kinds, 1):
                    try:
                        r, t = await timed_call(client, "execute_code", {"code": CODES[kind], "session": me.handle})
                    except Exception as exc:  # a timeout or a transport failure: count it, keep going
                        res.fail("errors", f"{who}: {kind} call #{n} raised {type(exc).__name__}: {exc}"[:300])
                        continue
                    res.latency[kind].append(t)
                    check_answer(res, who, r, me.handle, n, me.secret, kind)
                    res.done += 1
                res.last_end = max(res.last_end, time.perf_counter())
            # the session's whole state: its own secret, and exactly this client's count of increments
            r, _ = await timed_call(client, "execute_code", {"code": FINAL, "session": me.handle})
            final = r.structured_content.get("result") if (r.structured_content and not r.is_error) else None
            if final != {"secret": me.secret, "counter": args.calls}:
                leaked = isinstance(final, dict) and final.get("secret") != me.secret
                res.fail("leaks" if leaked else "wrong",
                         f"{who}: final state {str(final)[:80]!r}, expected counter {args.calls} and its own secret")
    except Exception as exc:
        res.fail("errors", f"{who}: {type(exc).__name__}: {exc}"[:300])
    finally:
        if not counted:
            ready[0] += 1
        finished[0] += 1


async def intrude(client: Client, me: Handle, everyone: list[Handle], res: Results, args: argparse.Namespace) -> None:
    """With client 0's connection (its token), try the handles of sessions another token owns, during the load."""
    victims = [h for h in everyone if h.token_index != me.token_index and h.handle]
    if not victims:
        res.fail("errors", "intruder: no session of another token to try (use --tokens 2 or more and 2+ clients)")
        return
    await anyio.sleep(0.5)
    for v in victims:
        for tool, arguments in (("execute_code", {"code": "result = secret", "session": v.handle}),
                                ("list_variables", {"session": v.handle}),
                                ("close_session", {"session": v.handle})):
            res.intrusions += 1
            try:
                r, _ = await timed_call(client, tool, arguments)
            except Exception as exc:
                res.fail("errors", f"intruder: {tool} on client {v.index:02d}'s session raised {type(exc).__name__}: {exc}"[:300])
                continue
            body = text_of(r) + json.dumps(r.structured_content or {})
            if v.secret in body:
                res.fail("leaks", f"intruder: {tool} on client {v.index:02d}'s session returned its secret")
            elif not r.is_error:
                res.fail("leaks", f"intruder: {tool} on client {v.index:02d}'s session (another token) was accepted: {body[:200]}")
            elif "unknown session" not in text_of(r):
                res.fail("wrong", f"intruder: {tool} refused, but not as an unknown session: {text_of(r)[:200]}")
        await anyio.sleep(0.2)


async def check_401(server: Server, res: Results) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx2.AsyncClient(timeout=30) as http:
        for label, extra in (("no token", {}), ("a wrong token", {"Authorization": "Bearer " + secrets.token_urlsafe(24)})):
            status = (await http.post(server.url, json=body, headers={**headers, **extra})).status_code
            if status != 401:
                res.fail("leaks", f"a request with {label} got HTTP {status}, not 401")


async def alone_baseline(server: Server, res: Results, rounds: int) -> None:
    """The same cells from one client with the server otherwise idle (after the warm pool filled)."""
    async with mcp_client(server.url, server.tokens[0]) as client:
        r, _ = await timed_call(client, "new_session", {})
        handle = r.structured_content["session"]
        secret = secrets.token_hex(8)
        await timed_call(client, "execute_code", {"code": SETUP.format(secret=secret), "session": handle})
        kinds = ["quick"] * (rounds * 8) + ["sleep"] * rounds + ["numpy"] * rounds
        random.Random(0).shuffle(kinds)
        for n, kind in enumerate(["quick"] * 5 + kinds, 1):  # 5 quick warm-up calls, not counted
            r, t = await timed_call(client, "execute_code", {"code": CODES[kind], "session": handle})
            check_answer(res, "alone", r, handle, n, secret, kind)
            if n > 5:
                res.alone[kind].append(t)
        await timed_call(client, "close_session", {"session": handle})


async def progress(res: Results, total: int, t0: float, server: Server, every: float) -> None:
    while True:
        await anyio.sleep(every)
        s = rss_mb(server.pid) or 0.0
        res.peak_rss = max(res.peak_rss, s)
        try:
            res.peak_fds = max(res.peak_fds, fd_count(server.pid))
        except OSError:
            pass
        el = time.perf_counter() - t0
        log(f"  {res.done}/{total} calls in {el:.0f} s ({res.done / el:.1f} calls/s), errors {res.errors}, wrong {res.wrong}, "
            f"leaks {res.leaks}; server RSS {s:.0f} MB")


async def run(args: argparse.Namespace) -> int:
    res = Results()
    tokens = [secrets.token_urlsafe(24) for _ in range(args.tokens)]
    total = args.clients * args.calls
    with short_tmp("kxl") as base:
        async with Server(base, args, tokens) as server:
            log(f"server pid {server.pid} at {server.url}: {args.tokens} tokens, pool {args.pool_size}; waiting for the warm pool")
            if not await server.wait_kernels(args.pool_size):
                log(f"  the pool did not fill ({len(kernel_pids(server.pid))} kernels)")
            await anyio.sleep(1.0)
            await check_401(server, res)
            log(f"baseline: one client alone ({args.alone * 10} calls)")
            await alone_baseline(server, res, args.alone)
            await server.wait_kernels(args.pool_size, timeout=60)
            await anyio.sleep(1.0)
            before = server.sample()
            log(f"before: server RSS {before['rss_mb']:.0f} MB, {before['fds']} fds, {before['kernels']} kernels")

            handles = [Handle(i, i % args.tokens, secret=secrets.token_hex(16)) for i in range(args.clients)]
            ready, finished = [0], [0]
            go = anyio.Event()
            log(f"{args.clients} clients: new_session + setup each (concurrently)")
            t_setup = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i in range(args.clients):
                    tg.start_soon(run_client, i, args, server, res, handles[i], handles, ready, go, finished)
                with anyio.fail_after(600):
                    while ready[0] < args.clients:
                        await anyio.sleep(0.05)
                setup_s = time.perf_counter() - t_setup
                peak_sessions = server.sample()
                log(f"  all sessions ready in {setup_s:.1f} s ({peak_sessions['kernels']} kernels); "
                    f"{args.clients} x {args.calls} calls start now")
                cpu0 = cpu_snapshot(server)
                t0 = time.perf_counter()
                go.set()
                ticker = anyio.CancelScope()

                async def tick() -> None:
                    with ticker:
                        await progress(res, total, t0, server, args.progress)

                tg.start_soon(tick)
                while finished[0] < args.clients:  # each client counts itself in when it stops, however it stops
                    await anyio.sleep(0.05)
                ticker.cancel()
            wall = (res.last_end or time.perf_counter()) - t0
            cpu = {k: v - cpu0[k] for k, v in cpu_snapshot(server).items()}
            peak = server.sample()
            peak["rss_mb"] = max(peak["rss_mb"], res.peak_rss, peak_sessions["rss_mb"])
            peak["fds"] = max(peak["fds"], res.peak_fds, peak_sessions["fds"])
            peak["kernels"] = max(peak["kernels"], peak_sessions["kernels"])
            peak["tree_rss_mb"] = max(peak["tree_rss_mb"], peak_sessions["tree_rss_mb"])
            log(f"calls done in {wall:.1f} s; closing the {args.clients} sessions")
            await close_all(server, handles, res)
            refilled = await server.wait_kernels(args.pool_size, timeout=120)
            await anyio.sleep(2.0)
            after = server.sample()
            if not refilled:
                log(f"  after closing: {after['kernels']} kernel processes, expected the pool's {args.pool_size}")
            alive = server.proc is not None and server.proc.poll() is None
            server_log = server.log_tail(15)
    return report(args, res, wall, total, setup_s, before, peak, after, alive, server_log, cpu)


def cpu_snapshot(server: Server) -> dict[str, float]:
    """CPU seconds used so far by the server, by the processes below it (kernels, wrappers), and by this process.
    A kernel that exits between two snapshots takes its CPU time with it: take both while the sessions live."""
    return {"server": cpu_seconds(server.pid), "kernels": sum(cpu_seconds(p) for p in descendants(server.pid)),
            "clients": cpu_seconds("self")}


async def close_all(server: Server, handles: list[Handle], res: Results) -> None:
    by_token: dict[int, list[Handle]] = {}
    for h in handles:
        if h.handle:
            by_token.setdefault(h.token_index, []).append(h)
    for ti, hs in by_token.items():
        async with mcp_client(server.url, server.tokens[ti]) as client:
            for h in hs:
                try:
                    r, _ = await timed_call(client, "close_session", {"session": h.handle})
                except Exception as exc:
                    res.fail("errors", f"close_session of client {h.index:02d} raised {type(exc).__name__}: {exc}"[:300])
                    continue
                if r.is_error:
                    res.fail("errors", f"close_session of client {h.index:02d}: {text_of(r)[:200]}")


def report(args: argparse.Namespace, res: Results, wall: float, total: int, setup_s: float, before: dict[str, Any],
           peak: dict[str, Any], after: dict[str, Any], alive: bool, server_log: str, cpu: dict[str, float]) -> int:
    rows: list[Measurement] = []
    calls = sum(len(v) for v in res.latency.values())
    rows.append(Measurement("load: new_session (all clients at once)", MS, res.new_session,
                            note=f"{args.clients} concurrent; the first {args.pool_size} from the warm pool, the rest cold"))
    for kind in CODES:
        base = f"alone: {KIND_LABEL[kind]}"
        rows.append(Measurement(base, MS, res.alone[kind], note="one client, server otherwise idle" if kind == "quick" else ""))
    for kind in CODES:
        rows.append(Measurement(f"load: {KIND_LABEL[kind]}", MS, res.latency[kind], baseline=f"alone: {KIND_LABEL[kind]}"))
    everything = [t for v in res.latency.values() for t in v]
    rows.append(Measurement("load: every call", MS, everything))
    rows.append(Measurement("load: throughput", "calls/s", [calls / wall] if wall else [],
                            note=f"{calls} answered calls / {wall:.1f} s wall (call phase); {os.cpu_count()} CPUs"))
    if getattr(args, "rows_out", None) is not None:  # python -m benchmarks: these rows join its table
        args.rows_out.extend(rows)
    print(f"\nkernelexec load test: {args.clients} clients x {args.calls} calls over streamable HTTP, {args.tokens} bearer tokens, "
          f"pool {args.pool_size}, slow share {args.slow_share:.0%}; sessions ready in {setup_s:.1f} s")
    print(table(rows))
    notes = [f"  {r.name}: {r.note}" for r in rows if r.note]
    print("\nnotes:\n" + "\n".join(notes))

    def fmt_fd(kinds: dict[str, int]) -> str:
        top = sorted(kinds.items(), key=lambda kv: -kv[1])[:4]
        return ", ".join(f"{k} {v}" for k, v in top)

    head = ["server", "RSS MB", "open fds", "kernel processes", "server+kernels RSS MB", "fds by kind (top 4)"]
    body = [[label, f"{s['rss_mb']:.1f}", str(s["fds"]), str(s["kernels"]), f"{s['tree_rss_mb']:.0f}", fmt_fd(s.get("fd_kinds", {}))]
            for label, s in (("before (pool filled, idle)", before), ("peak (all sessions live)", peak),
                             ("after (sessions closed, pool refilled)", after))]
    print()
    print(render_grid(head, body, right_align={1, 2, 3, 4}))
    print(f"\nfds after - before: {after['fds'] - before['fds']:+d}; RSS after - before: {after['rss_mb'] - before['rss_mb']:+.1f} MB; "
          f"server still running at the end: {'yes' if alive else 'NO'}")
    n = max(calls, 1)
    print(f"CPU during the call phase ({wall:.1f} s x {os.cpu_count()} CPUs = {wall * (os.cpu_count() or 1):.0f} CPU-s): "
          f"server {cpu['server']:.1f} s ({cpu['server'] / n * 1000:.1f} ms/call), kernels and their wrappers {cpu['kernels']:.1f} s "
          f"({cpu['kernels'] / n * 1000:.1f} ms/call), clients (this process) {cpu['clients']:.1f} s ({cpu['clients'] / n * 1000:.1f} ms/call)")
    print(f"answers: {calls}/{total} calls answered; errors {res.errors}; wrong answers {res.wrong}; leaks {res.leaks}; "
          f"cross-token attempts {res.intrusions}, all refused as unknown sessions: {'yes' if res.intrusions and not any('intruder' in f or 'HTTP' in f for f in res.failures) else 'NO'}")
    ok = not res.failures and alive and calls == total
    if res.failures:
        print(f"\nFAILURES: {res.errors + res.wrong + res.leaks} (the first {min(40, len(res.failures))} listed)")
        for f in res.failures[:40]:
            print("  " + f)
        print("\nserver log tail:\n" + server_log)
    print("\nresult: " + ("PASS" if ok else "FAIL"))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "wall_s": wall, "setup_s": setup_s, "before": before, "peak": peak, "after": after,
            "errors": res.errors, "wrong": res.wrong, "leaks": res.leaks, "intrusions": res.intrusions, "failures": res.failures,
            "latency_ms": res.latency, "alone_ms": res.alone, "new_session_ms": res.new_session, "cpu_s": cpu, "pass": ok,
            "summary": {k: {"p50": percentile(v, 50), "p95": percentile(v, 95), "p99": percentile(v, 99)} for k, v in res.latency.items()},
        }, indent=2))
        log(f"wrote {args.json}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, help="concurrent MCP clients, one session each (default 20; 5 with --quick)")
    parser.add_argument("--calls", type=int, help="execute_code calls per client (default 100; 20 with --quick)")
    parser.add_argument("--tokens", type=int, default=2, help="bearer tokens in the server's token file (default 2)")
    parser.add_argument("--pool-size", type=int, default=4, help="the server's warm pool (default 4)")
    parser.add_argument("--slow-share", type=float, default=0.2, help="share of slow cells (default 0.2)")
    parser.add_argument("--alone", type=int, help="baseline rounds (x10 calls) from one client before the load (default 5; 2 with --quick)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--progress", type=float, default=10.0, help="seconds between progress lines (stderr)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 5 clients x 20 calls, 20 baseline calls")
    parser.add_argument("--json", metavar="FILE", help="also write raw latencies and samples to FILE")
    args = parser.parse_args(argv)
    for name, full, quick in (("clients", 20, 5), ("calls", 100, 20), ("alone", 5, 2)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.clients < 2 or args.tokens < 2 or args.calls < 1:
        parser.error("need --clients >= 2, --tokens >= 2 and --calls >= 1 (the cross-token check needs two tokens)")
    for name in ("httpx", "httpx2", "mcp"):
        logging.getLogger(name).setLevel(logging.WARNING)
    log(f"kernelexec load test: {args.clients} clients x {args.calls} calls; loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sys.exit(anyio.run(run, args, backend="asyncio"))


if __name__ == "__main__":
    main()
