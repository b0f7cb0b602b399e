"""Text a human sees in an MCP client: the one filter for kernel and upstream text on its way out.

``display(text, limit)`` is applied to every piece of kernel or upstream text the server puts in front of a
person or the model's reader: a cell's ``input()``/``getpass()`` prompt in the elicitation dialog
(server/questions.py), code mode's approval question (codemode/broker.py), the live tail in progress
notifications and in ``running``/``awaiting_input`` answers (server/app.py), an answer's text
(server/render.py) and the run view's table cells (server/view.py). Precisely:

1. not a string: its ``str()``; a lone surrogate becomes ``\\udXXX`` (visible, valid Unicode);
2. line breakers are newlines: ``\\r\\n``, ``\\r``, VT, FF, NEL (U+0085), LINE SEPARATOR U+2028 and
   PARAGRAPH SEPARATOR U+2029 each become ``\\n`` (no carriage return rewrites a line, no separator a
   client renders as a break that the text does not show as one);
3. every other C0 control (except ``\\t``), DEL and every C1 control becomes ``\\xNN`` (``ESC`` -> ``\\x1b``: no
   terminal escape reaches a client that prints it);
4. every invisible format character (Unicode category Cf: bidi embeddings, overrides U+202A-U+202E and
   isolates U+2066-U+2069, ALM U+061C, zero-width U+200B-U+200F, BOM U+FEFF, soft hyphen, tag characters
   U+E0000-...) becomes ``\\uXXXX`` / ``\\UXXXXXXXX``: text cannot be reordered or hidden;
5. a run of blank lines (whitespace only) is collapsed to one blank line (no screenful of nothing pushing
   the server's words out of sight);
6. then bounded: at most ``limit`` characters, cut head + tail with longtext's marker (``None``: no bound).

Backslashes are left as they are: the output is for reading, not for parsing back. terminal.py's ``safe``
is the same idea for a terminal (it keeps ``\\r`` escaped and does not collapse or cut).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from kernelexec.longtext import cut

DEFAULT_LIMIT = 4_000

_BREAKS = re.compile("\r\n|[\r\x0b\x0c\x85\u2028\u2029]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # newline and tab stay
_SURROGATE = re.compile("[\ud800-\udfff]")
_BLANK_RUN = re.compile(r"\n(?:[ \t]*\n){2,}")
_PLAIN = re.compile(r"[\x20-\x7e\n\t]*")


def _hex(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def _code(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _no_format(text: str) -> str:
    if text.isascii():
        return text
    return "".join(_code(c) if unicodedata.category(c) == "Cf" else c for c in text)


def display(text: Any, limit: int | None = DEFAULT_LIMIT) -> str:
    """``text`` safe to show a person (see the module docstring), at most ``limit`` characters plus the cut's marker."""
    if not isinstance(text, str):
        text = str(text)
    if not (text.isascii() and _PLAIN.fullmatch(text)):
        text = _SURROGATE.sub(lambda m: _code(m.group()), text)
        text = _BREAKS.sub("\n", text)
        text = _CONTROL.sub(_hex, text)
        text = _no_format(text)
    text = _BLANK_RUN.sub("\n\n", text)
    if limit is not None:
        text = cut(text, limit)[0]
    return text


__all__ = ["DEFAULT_LIMIT", "display"]
