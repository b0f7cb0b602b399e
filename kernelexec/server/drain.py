"""Drain: how a server stopped by a deploy (SIGTERM, or a first Ctrl-C) leaves without losing an answer.

Without it, uvicorn closes the listener at once and, once its connections are done, raises the signal again with
the default handler: the process died there, before the session manager's cleanup, so a cell of a yielded call
stayed ``running`` in the session store for ever (another replica following it never got an answer) and its
session's lease was never released (the next holder waited out its expiry).

Draining (``--drain-timeout``, ``--drain-notice``):

1. ``/healthz`` answers 503 at once, so a balancer's health check marks this replica down; where something has
   checked ``/healthz`` (a balancer), the listener stays open ``--drain-notice`` seconds, every call still served
   and answered as usual (an answer beats an error the client must retry), so that nothing the balancer still
   sends before it notices is refused;
2. the server keeps going until none of its runs is unfinished (cells of yielded calls, background runs, tasks),
   at most ``--drain-timeout`` seconds after the signal;
3. calls still waiting on a run (``get_run``, a yielded ``execute_code``) are answered with what they have (its
   client asks again, and the balancer sends that to another replica); the listener closes;
4. the session manager stops as usual: in a fleet, runs past the deadline are handed over (their cells not
   interrupted; the next holder of their session collects their answers: ``SessionManager.hand_over``), leases are
   released (another replica takes a session at once) and gateway kernels stay up.

A second signal stops at once (step 3 on).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio

logger = logging.getLogger(__name__)

CLOSE_GRACE = 5  # seconds the listener's connections get to finish once the drain is over (then they are cut)


@dataclass
class Drain:
    """One server's drain: when it began, whether a balancer checks this server, the calls waiting on runs."""

    notice: float = 0.0  # seconds /healthz fails before the listener closes (where a balancer checks it)
    timeout: float = 0.0  # seconds, from the signal, that unfinished runs are waited for
    began: float | None = None
    checked: bool = False  # /healthz was asked: a balancer routes to this server and must see it leave
    ended: bool = False
    said: bool = False  # the drain's start logged
    _waiting: set[anyio.CancelScope] = field(default_factory=set)

    @property
    def draining(self) -> bool:
        return self.began is not None

    def begin(self) -> None:
        if self.began is None:
            self.began = time.monotonic()

    def over(self, unfinished: int) -> bool:
        """Whether the drain can end now, with ``unfinished`` runs left."""
        if self.began is None:
            return False
        elapsed = time.monotonic() - self.began
        if self.checked and elapsed < self.notice:
            return False
        return unfinished == 0 or elapsed >= self.timeout

    def end(self) -> None:
        """The drain is over: every call waiting on a run answers with what it has."""
        self.ended = True
        for scope in list(self._waiting):
            scope.cancel()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Around a call's wait for a run: cut short (not failed) when the drain ends, so its answer goes out
        before the listener closes."""
        scope = anyio.CancelScope()
        if self.ended:
            scope.cancel()
        self._waiting.add(scope)
        try:
            with scope:
                yield
        finally:
            self._waiting.discard(scope)


def draining_server(config: Any, drain: Drain, unfinished: Callable[[], int]) -> Any:
    """A ``uvicorn.Server`` whose first SIGTERM/SIGINT begins ``drain`` (``unfinished``: the runs not done yet)
    instead of stopping, and that never raises the signal again on its way out (the caller cleans up, then returns)."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if sig in (signal.SIGTERM, signal.SIGINT) and not drain.draining:
                drain.begin()  # the next tick says so and does the rest (a signal handler does as little as it can)
                return
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:  # uvicorn would raise them again once its handlers are gone: the default one kills
                    self._captured_signals.clear()

        async def on_tick(self, counter: int) -> bool:
            if drain.draining and not drain.ended and not self.should_exit:
                left = unfinished()
                if not drain.said:
                    drain.said = True
                    logger.warning("stopping: draining (/healthz fails%s; %d run(s) unfinished, waited for up to %.0f s)",
                                   f", the listener stays open {drain.notice:.0f} s for the balancer" if drain.checked else "",
                                   left, drain.timeout)
                elif counter % 50 == 0:
                    logger.warning("draining: %d run(s) unfinished, %.0f s since the signal", left,
                                time.monotonic() - (drain.began or 0.0))
                if drain.over(left):
                    logger.warning("drained in %.1f s", time.monotonic() - (drain.began or 0.0))
                    if left:
                        logger.warning("drain deadline (%.0f s): %d run(s) still unfinished are handed over (a fleet's: "
                                       "collected by the next holder of their session) or recorded as lost",
                                       drain.timeout, left)
                    drain.end()
                    self.config.timeout_graceful_shutdown = CLOSE_GRACE
                    self.should_exit = True
            return await super().on_tick(counter)

    return DrainingServer(config)
