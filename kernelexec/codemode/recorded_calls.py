"""Code mode on replay and restore: a cell's tool calls answered from the record, not the live servers.

``kernelexec replay`` and a session's restore rerun recorded cells; their ``mcp_tools`` calls get the results
the notebook recorded (offline, deterministic), or with ``--live-tools`` go to the live broker with the
differences from the record noted. Apart from ``broker.py``, which makes live calls, so neither hides the other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelexec.codemode.broker import MAX_BATCH
from kernelexec.codemode.config import python_name

if TYPE_CHECKING:
    from kernelexec.codemode.broker import CellCalls


def _recorded_item(record: Any) -> dict[str, Any]:
    if record.result is not None:
        return {"ok": True, **{k: record.result.get(k) for k in ("kind", "value", "images")}}
    return {"ok": False, "refused": record.refused, "message": record.error or "the call failed"}


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def catalog_from_records(records: Any, live: str | None = None) -> str:
    """A kernel catalog (``_kernelexec_tools_catalog``) naming every recorded server.tool (arguments unchecked:
    replay serves what was recorded), with the live broker's entries where it has them."""
    data = json.loads(live) if live else {"tools": [], "unavailable": {}, "refused": {}}
    have = {(t["server"], t["tool"]) for t in data["tools"]}
    for record in records:
        key = (python_name(record.server), python_name(record.tool))
        if key not in have:
            have.add(key)
            data["tools"].append({"server": key[0], "tool": key[1], "name": record.tool, "server_name": record.server,
                                  "description": "(recorded: replay serves this tool's recorded results)",
                                  "input_schema": {"type": "object", "properties": {}}})
            data["unavailable"].pop(key[0], None)
    return json.dumps(data)


@dataclass
class RecordedCalls:
    """One replayed cell's tool calls: answered from its recorded calls in order (offline, deterministic), or with
    ``live`` by the live servers, the differences from the record noted."""

    recorded: list[Any]  # recording.RecordedToolCall
    live: CellCalls | None = None
    served: int = 0
    notes: list[str] = field(default_factory=list)

    async def handle(self, payload: Any) -> dict[str, Any]:
        calls = payload.get("calls") if isinstance(payload, dict) else None
        if not isinstance(payload, dict) or payload.get("op") != "call" or not isinstance(calls, list):
            return {"error": "malformed tool request"}
        results = []
        for call in calls[:MAX_BATCH]:
            server = str(call.get("server", "")) if isinstance(call, dict) else ""
            tool = str(call.get("tool", "")) if isinstance(call, dict) else ""
            at = next((i for i, r in enumerate(self.recorded)
                       if python_name(r.server) == python_name(server) and python_name(r.tool) == python_name(tool)), None)
            record = self.recorded.pop(at) if at is not None else None
            if self.live is not None:
                item = await self.live.one(call)
                if record is None:
                    self.notes.append(f"tool call {server}.{tool}: not in the record; called live")
                else:
                    was = _recorded_item(record)
                    if {k: was.get(k) for k in ("ok", "value")} != {k: item.get(k) for k in ("ok", "value")}:
                        self.notes.append(f"tool call {server}.{tool}: recorded {_short(was.get('value', was.get('message')))}, "
                                          f"live {_short(item.get('value', item.get('message')))}")
            elif record is None:
                item = {"ok": False, "refused": False, "message": f"replay has no recorded result for {server}.{tool} "
                        "(it serves the recorded calls; --live-tools calls the servers)"}
                self.notes.append(f"tool call {server}.{tool}: no recorded result; the cell got ToolError")
            else:
                item = _recorded_item(record)
                self.served += 1
            results.append(item)
        return {"results": results}

    def summary(self) -> str | None:
        """The cell's line for replay's report: how its tool calls were answered."""
        if self.live is not None:
            return f"tool calls: {len(self.live.records)} made live (--live-tools)" if self.live.records else None
        return f"tool calls: {self.served} served from the record (offline; --live-tools calls the servers)" if self.served else None
