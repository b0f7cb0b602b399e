"""The runtime's report (``startup/runtime._Report``) as IPython formats a user expression: the payload travels once,
as ``application/json`` (what ``kernel/report.py`` reads); its ``text/plain`` is a short name, so a large result is
not encoded, sent and decoded a second time on every cell. Formatted by IPython's own ``DisplayFormatter``."""

from __future__ import annotations

from IPython.core.formatters import DisplayFormatter

from startup.runtime import _Report


def test_the_report_travels_once_as_json() -> None:
    payload = {"kind": "variable", "format": "json", "text": "x" * 100_000, "streams": {}, "cost": {"cpu_s": 0.001}}
    data, _ = DisplayFormatter().format(_Report(payload))
    assert data["application/json"] == payload
    assert len(data["text/plain"]) < 100 and "xxxx" not in data["text/plain"]
