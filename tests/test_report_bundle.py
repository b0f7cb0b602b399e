"""The runtime's report (``startup/runtime._Report``) as the kernel answers the server's user expression: the payload
travels once, as ``application/json`` (what ``kernel/report.py`` reads); its ``text/plain`` is a short name, so a
large result is not encoded, sent and decoded a second time on every cell. ``format_reports_directly`` answers a
report as that bundle without IPython's eleven formatters; every other value is formatted as IPython formats it.
Formatted by a real IPython shell's own ``user_expressions``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from IPython.core.formatters import DisplayFormatter
from IPython.core.interactiveshell import InteractiveShell

from startup.runtime import _Report, format_reports_directly

PAYLOAD = {"kind": "variable", "format": "json", "text": "x" * 100_000, "streams": {}, "cost": {"cpu_s": 0.001}}


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    real = shell.display_formatter
    shell.display_formatter = DisplayFormatter(parent=shell)
    try:
        yield shell
    finally:
        shell.display_formatter = real


def test_the_report_travels_once_as_json() -> None:
    data, _ = DisplayFormatter().format(_Report(PAYLOAD))
    assert data["application/json"] == PAYLOAD
    assert len(data["text/plain"]) < 100 and "xxxx" not in data["text/plain"]


def test_a_report_is_its_bundle_and_everything_else_is_formatted_as_before(shell: InteractiveShell) -> None:
    shell.user_ns["_report"] = lambda: _Report(PAYLOAD)
    asked = {"report": "_report()", "other": "[1, 2]", "html": "__import__('IPython').display.HTML('<b>b</b>')",
             "fails": "1/0"}
    before = shell.user_expressions(asked)
    format_reports_directly(shell.display_formatter)
    after = shell.user_expressions(asked)
    assert after == before  # the same answer: the JSON once, its short name as text
    assert after["report"] == {"status": "ok", "metadata": {},
                               "data": {"text/plain": repr(_Report(PAYLOAD)), "application/json": PAYLOAD}}
    assert after["html"]["data"]["text/html"] == "<b>b</b>" and after["fails"]["status"] == "error"


def test_a_report_skips_ipythons_formatters(shell: InteractiveShell) -> None:
    seen: list[object] = []
    shell.display_formatter.formatters["text/html"].for_type(_Report, lambda obj: seen.append(obj) or "<i>r</i>")
    shell.user_ns["_report"] = lambda: _Report(PAYLOAD)
    assert "text/html" in shell.user_expressions({"r": "_report()"})["r"]["data"] and seen  # IPython's way: all of them
    seen.clear()
    format_reports_directly(shell.display_formatter)
    assert "text/html" not in shell.user_expressions({"r": "_report()"})["r"]["data"] and not seen
