"""Runs: work longer than a client will wait for one tool call.

Every ``execute_code`` cell is a run, a task in the session manager's task group: a foreground call
waits for it up to ``--yield-after`` seconds and then answers with what it has and the run id (the
cell goes on); ``execute_code(background=True)`` returns the run id at once. ``get_run(run_id,
wait_s)`` waits up to ``wait_s`` for it and returns the finished answer, or the output so far. A run holds its session's lock like any call, so calls
to that session queue behind it; ``interrupt(session)`` stops it without waiting for the lock.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from .errors import InvalidRequest, KernelexecError
from .models import ResultRule

if TYPE_CHECKING:
    from .render import Rendered
    from .sessions import Session

KEEP_FINISHED = 200  # finished runs remembered for get_run


@dataclass
class Run:
    id: str
    session: Session
    started: float = field(default_factory=time.monotonic)
    done: anyio.Event = field(default_factory=anyio.Event)
    rendered: Rendered | None = None
    failure: str | None = None
    output_chars: int = 0
    tail: str = ""
    listener: Callable[[str, str], Awaitable[None]] | None = None  # the waiting call's progress, while it waits
    scope: anyio.CancelScope | None = None

    async def on_output(self, name: str, text: str) -> None:
        self.output_chars += len(text)
        self.tail = (self.tail + text[-2000:])[-2000:]  # never a copy of a whole flood chunk
        listener = self.listener
        if listener is not None:
            try:
                await listener(name, text)
            except Exception:  # noqa: BLE001 - a client gone mid-call never stops the cell
                self.listener = None

    def asker(self, ask: Callable[[str, bool], Awaitable[str | None]]) -> Callable[[str, bool], Awaitable[str | None]]:
        """``ask`` while the call that started the run waits for it; declined (None) once it has yielded,
        since nobody could answer then."""
        async def attached(prompt: str, password: bool) -> str | None:
            return await ask(prompt, password) if self.listener is not None else None

        return attached

    def cancel(self) -> None:
        """Cancel the cell as a cancelled call would (the kernel is interrupted, the cell recorded)."""
        if self.scope is not None:
            self.scope.cancel()

    @property
    def elapsed_ms(self) -> float:
        return round((time.monotonic() - self.started) * 1000, 3)


class RunRegistry:
    """All background runs of one server process."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, Run] = OrderedDict()
        self._tg: Any = None

    def attach(self, task_group: Any) -> None:
        self._tg = task_group

    def start(self, session: Session, code: str, *, timeout: float, working_dir: str | None,
              listener: Callable[[str, str], Awaitable[None]] | None = None, result_rule: ResultRule = "variable",
              ask: Callable[[str, bool], Awaitable[str | None]] | None = None) -> Run:
        if self._tg is None:
            raise KernelexecError("background runs need a running session manager")
        run = Run(id="run-" + secrets.token_urlsafe(9), session=session, listener=listener, scope=anyio.CancelScope())
        self._runs[run.id] = run
        self._prune()

        async def body() -> None:
            assert run.scope is not None
            try:
                with run.scope:
                    run.rendered = await session.run(code, timeout=timeout, working_dir=working_dir, on_output=run.on_output,
                                                     result_rule=result_rule, ask=run.asker(ask) if ask is not None else None)
                if run.scope.cancelled_caught:
                    run.failure = "cancelled by the client; the kernel was interrupted"
            except KernelexecError as exc:
                run.failure = str(exc)
            except Exception as exc:  # never lose a run silently: the failure is its answer
                run.failure = f"{type(exc).__name__}: {exc}"
            finally:
                run.done.set()

        self._tg.start_soon(body)
        return run

    def get(self, run_id: str, *, owner: str | None) -> Run:
        run = self._runs.get(run_id) if isinstance(run_id, str) else None
        if run is None or (run.session.owner is not None and run.session.owner != owner):
            raise InvalidRequest(f"unknown run {str(run_id)[:80]!r} (finished runs are kept for the last {KEEP_FINISHED} runs)")
        return run

    def forget(self, run: Run) -> None:
        """Drop a run whose answer its own call returned (no get_run will ask), so the finished runs kept
        for get_run are the ones that yielded or ran in the background."""
        self._runs.pop(run.id, None)

    async def wait(self, run: Run, wait_s: float) -> bool:
        with anyio.move_on_after(wait_s):
            await run.done.wait()
        return run.done.is_set()

    def _prune(self) -> None:
        finished = [k for k, r in self._runs.items() if r.done.is_set()]
        for key in finished[: max(0, len(finished) - KEEP_FINISHED)]:
            del self._runs[key]
