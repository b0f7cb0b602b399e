"""Code mode's broker attacked from a cell, without a kernel: the cell controls every byte of its requests.

The kernel side (startup/mcp_tools.py) is a convenience; these go straight at ``CellCalls.handle``, the
server's entry point for what a cell sends over the stdin channel, and at the approval path.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import pytest

from kernelexec.codemode.broker import APPROVAL_SHOWN, ApprovalCall, Broker, Limits, approval_message
from kernelexec.codemode.config import Upstream
from kernelexec.config import Settings
from kernelexec.session.runs import QUESTIONS_PER_MINUTE, Question, Run

pytestmark = pytest.mark.anyio


def forged(server: str, tool: str, arguments: Any, n: int = 1) -> dict[str, Any]:
    return {"op": "call", "calls": [{"server": server, "tool": tool, "arguments": arguments}] * n}


async def test_a_flood_of_malformed_calls_is_counted_and_its_record_stays_bounded() -> None:
    """Malformed calls used to skip the per-cell count and kept their (huge) arguments in the record."""
    calls = Broker([], limits=Limits(calls_per_cell=10)).cell(None)
    for _ in range(20):
        await calls.handle(forged("x", "y", "A" * 100_000, n=64))
    assert calls.count == 20 * 64
    assert len(calls.records) == 11  # ten calls, then one line saying the rest were refused and not recorded
    assert len(json.dumps(calls.records)) < 10_000
    assert "not recorded" in calls.records[-1]["error"]


async def test_oversized_arguments_are_not_kept_in_the_record() -> None:
    calls = Broker([]).cell(None)
    reply = await calls.handle(forged("x", "y", {"blob": "B" * 2_000_000}))
    assert reply["results"][0]["ok"] is False
    assert "B" * 1000 not in json.dumps(calls.records)


async def test_no_call_is_made_after_the_cells_timeout() -> None:
    calls = Broker([]).cell(None, timeout=0.0)
    await anyio.sleep(0.01)
    result = (await calls.handle(forged("x", "y", {})))["results"][0]
    assert result["ok"] is False and "timeout" in result["message"]


def test_an_approval_shows_every_argument_or_is_not_asked() -> None:
    """The cell picks key names: a cut at a length would let it push the dangerous argument out of sight."""
    hidden = {"a_note": "harmless " + " " * 790, "z_path": "/home/u/.ssh/authorized_keys"}
    assert approval_message("fs", "write", hidden, "fs.*") is None
    shown = approval_message("fs", "write", {"path": "x"}, "fs.*")
    assert shown is not None and '"path": "x"' in shown
    assert len(json.dumps(hidden)) > APPROVAL_SHOWN


def test_an_approval_cannot_reorder_or_hide_its_text() -> None:
    tricky = {"path": "safe\u202etxt.exe\u2028second line\u200b"}
    shown = approval_message("fs", "write", tricky, "fs.*")
    assert shown is not None
    assert not any(ch in shown for ch in "\u202e\u2028\u200b")
    assert "\\u202e" in shown


async def test_approvals_of_one_run_are_asked_one_at_a_time_and_rate_limited() -> None:
    """Concurrent approvals of a batch used to overwrite each other: the human's yes to one applied to another."""
    run = Run(id="run-test", session=None)  # type: ignore[arg-type]
    run.deadline = time.monotonic() + 30
    asking = 0
    most = 0

    async def direct(question: Question) -> bool:
        nonlocal asking, most
        asking += 1
        most = max(most, asking)
        await anyio.sleep(0.02)
        asking -= 1
        return True

    run.listener = lambda *_: None  # type: ignore[assignment]  # the starting call still waits
    approve = run.approver(direct)
    verdicts: list[bool | None] = []

    async def one() -> None:
        call = ApprovalCall("fs", "write", '{"n": 1}')
        verdict = await approve("kernelexec: ... Approve this one call?", call)
        assert verdict is not None and verdict.call == call  # the verdict names the call it was asked about
        verdicts.append(verdict.approved)

    async with anyio.create_task_group() as tg:
        for _ in range(QUESTIONS_PER_MINUTE + 3):
            tg.start_soon(one)
    assert most == 1
    assert verdicts.count(True) == QUESTIONS_PER_MINUTE and verdicts.count(False) == 3


def test_patterns_with_spaces_still_match_and_an_empty_allow_list_allows_nothing() -> None:
    settings = Settings(tools_approve="github.delete_*, fs.write_*", tools_allow="")
    assert settings.tools_approve == ["github.delete_*", "fs.write_*"]
    broker = Broker([], allow=settings.tools_allow, approve=settings.tools_approve)
    assert broker.allow == []


def test_upstream_errors_do_not_carry_its_secrets() -> None:
    up = Upstream("api", "http", "cfg", url="https://user:pw1234@api.example/mcp?api_key=sk-SECRET42",
                  headers={"Authorization": "Bearer tok-XYZ123"})
    text = up.scrub("ConnectError: https://user:pw1234@api.example/mcp?api_key=sk-SECRET42 refused; Bearer tok-XYZ123")
    assert "SECRET42" not in text and "pw1234" not in text and "tok-XYZ123" not in text
    env = Upstream("db", "stdio", "cfg", command="db", env={"DB_PASSWORD": "hunter22"})
    assert "hunter22" not in env.scrub("exited: password hunter22 rejected")
