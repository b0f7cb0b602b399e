"""Comparing a cell's outputs, recorded against replayed: what must match, and the run-to-run noise left out.

Replay's verdict (``same`` / ``different``) is decided here, apart from running anything, so the rules are
testable on plain output lists: streams as whole texts, rich outputs in order, images by kind, errors by
name and message, after normalising memory addresses, uuids, timings, dates and the session's directory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from kernelexec.longtext import split_cut

_TIME_UNIT = r"(?:ns|µs|us|ms|s|sec|seconds|min)"  # µ: MICRO SIGN U+00B5 (GREEK MU U+03BC becomes it first)
_NORMALISE: list[tuple[re.Pattern[str], str]] = [
    (re.compile("\u03bc"), "\u00b5"),  # %timeit prints either micro sign, by platform and IPython version
    (re.compile(r"0x[0-9a-fA-F]{4,}"), "0x…"),
    # where ipykernel compiles cells (warnings name it): a per-kernel folder of the kernel's own temp dir
    (re.compile(r"(?:<session>)?(?:/[^\s'\"(<>/\x1b]+)*/ipykernel_\d+/(\d+\.py)\b"), r"<ipykernel>/\1"),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<uuid>"),  # uuid4().hex: display ids, widget and comm ids
    (re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"), "<datetime>"),
    (re.compile(rf"[\d.]+\s?{_TIME_UNIT} ± [\d.]+\s?{_TIME_UNIT} per loop \([^)]*\)"), "<timeit>"),
    # %timeit's remark when one run was much slower (a matter of load): said some runs, not others
    (re.compile(r"The slowest run took [\d.]+ times longer than the fastest\. This could mean that an intermediate "
                r"result is being cached\.\n"), ""),
    # %%time: "user 14 µs" too, and IPython's "%.3g" of a whole thousand, "sys: 1e+03 ns"
    (re.compile(rf"\b(Wall time:|CPU times: user|sys:|total:) [\d.]+(?:e[+-]?\d+)?\s?{_TIME_UNIT}"), r"\1 <time>"),
    (re.compile(rf"\b\d+\.\d+\s?{_TIME_UNIT}\b"), "<time>"),
]


def normalise(text: str, roots: Iterable[str] = ()) -> str:
    """Text with run-to-run noise replaced: session directories, addresses, uuids, dates, timings."""
    for root in roots:
        text = text.replace(root, "<session>")
    for pattern, replacement in _NORMALISE:
        text = pattern.sub(replacement, text)
    return text


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def comparable(outputs: list[dict[str, Any]], roots: Iterable[str] = ()) -> dict[str, Any]:
    """What of a cell's outputs must match on replay.

    Streams are compared as each stream's whole text (nbclient and the live collector split and
    order stream chunks differently); rich outputs in order, images by kind only (their bytes carry
    dates and random ids, and depend on fonts and library versions); errors by name and message, not
    traceback. The error
    kernelexec adds for a timed-out or killed cell is left out: endings are compared on their own.
    """
    roots = list(roots)
    streams: dict[str, str] = {"stdout": "", "stderr": ""}
    rich: list[str] = []
    errors: list[str] = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            name = out.get("name", "stdout")
            streams[name] = streams.get(name, "") + _text(out.get("text", ""))
        elif kind == "error":
            if out.get("ename") != "KernelexecError":
                errors.append(normalise(f"{out.get('ename')}: {out.get('evalue', '')}", roots))
        elif kind in ("display_data", "execute_result"):
            parts = []
            for mime, value in sorted((out.get("data") or {}).items()):
                if mime.startswith("image/"):
                    parts.append(mime)
                else:
                    parts.append(f"{mime}: {normalise(_text(value), roots)}")
            rich.append(f"{kind} " + " | ".join(parts))
    return {
        "stdout": normalise(streams.pop("stdout"), roots),
        "stderr": normalise(streams.pop("stderr"), roots),
        **{k: normalise(v, roots) for k, v in streams.items()},
        "outputs": rich,
        "errors": errors,
    }


def _same(recorded: Any, replayed: Any) -> bool:
    if isinstance(recorded, str) and isinstance(replayed, str):
        parts = split_cut(recorded)  # a flood of output is kept head+tail in the record (recording.JOURNAL_STREAM_CHARS)
        if parts is not None:
            head, tail = parts
            return replayed.startswith(head) and replayed.endswith(tail)
    return recorded == replayed


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def differences(recorded: dict[str, Any], replayed: dict[str, Any]) -> list[str]:
    """Human-readable lines naming each part of two ``comparable`` results that differ."""
    lines = []
    for key in sorted(set(recorded) | set(replayed)):
        a, b = recorded.get(key, ""), replayed.get(key, "")
        if _same(a, b):
            continue
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                lines.append(f"{key}: {len(a)} recorded, {len(b)} replayed")
            for i, (x, y) in enumerate(zip(a, b, strict=False), 1):
                if x != y:
                    lines.append(f"{key} #{i}: recorded {_short(x)}")
                    lines.append(f"{' ' * len(key)} #{i}: replayed {_short(y)}")
                    break
            else:  # one is the other plus more: name the first extra item
                if len(a) != len(b):
                    i, side, longer = min(len(a), len(b)) + 1, "recorded" if len(a) > len(b) else "replayed", max(a, b, key=len)
                    lines.append(f"{key} #{i}: {side} {_short(longer[i - 1])}")
        else:
            lines.append(f"{key}: recorded {_short(a)}")
            lines.append(f"{' ' * len(key)}  replayed {_short(b)}")
    return lines
