"""The one rule for text too long to show whole: its head and its tail, with a marker saying how much was
cut and where the whole is (the answer's ``*_file``, the spill file). The answer (server/render.py) and
the record (session/recording.py) cut this way, and replay reads the marker back; a running cell's output
so far is its last ``LIVE_TAIL`` characters (session/runs.py, server/app.py).

Head before tail: a traceback or a result's end matters, but what a program printed first (its banner,
its first error) is usually what explains the rest, so the head gets two thirds.
"""

from __future__ import annotations

import re

HEAD_SHARE = 2 / 3
LIVE_TAIL = 1_000  # characters of a running cell's latest output, in its progress and unfinished answers
_MARKER = re.compile(r"\n\[\.\.\. ([\d,]+) characters cut[^\n]* \.\.\.\]\n")


def cut(text: str, limit: int, *, where: str | None = None) -> tuple[str, bool]:
    """``text`` within ``limit`` characters (plus the marker): head and tail, and whether anything was cut.
    ``where``: said in the marker after "cut" (e.g. "in the record; the answer's stdout_file has them")."""
    if len(text) <= limit:
        return text, False
    head = int(limit * HEAD_SHARE)
    tail = limit - head
    omitted = len(text) - head - tail
    said = f" {where}" if where else ""
    return f"{text[:head]}\n[... {omitted:,} characters cut{said} ...]\n{text[len(text) - tail:]}", True


def split_cut(text: str) -> tuple[str, str] | None:
    """The head and tail of a text ``cut`` made (to compare it with the whole), or None if it is whole."""
    found = _MARKER.search(text)
    return None if found is None else (text[: found.start()], text[found.end():])


def live_tail(kept: str, more: str) -> str:
    """The last ``LIVE_TAIL`` characters of ``kept + more``, never copying all of a flood chunk."""
    return (kept + more[-LIVE_TAIL:])[-LIVE_TAIL:]
