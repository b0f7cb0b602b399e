"""Text for terminals: nothing a notebook, kernel, kernelspec, config or session file says reaches
a terminal raw.

``safe(text)`` turns every character a terminal would act on, or that hides or reorders text,
into a visible escape: C0 controls (except newline and tab), DEL, C1 controls (U+0080-U+009F,
e.g. ``\\x9b``, an 8-bit CSI), lone surrogates, and the Unicode bidi and invisible formatting
controls (U+200B-U+200F, U+202A-U+202E, U+2066-U+2069, U+FEFF, U+061C). So an OSC title set
``ESC ] 0 ; pwned BEL`` prints as ``\\x1b]0;pwned\\x07``, and a right-to-left override as
``\\u202e``. Backslashes are left alone: the output is for people to read, not to parse back.

``SafeFormatter`` applies it to every formatted log record (message, arguments, exception text),
``install_logging`` puts it on the root handlers, ``install_excepthook`` escapes an uncaught
traceback, and ``say`` is ``print`` for untrusted text.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any, TextIO

_FORMAT = "\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff\u061c"
# everything escaped, newline and tab included (those two are dropped by keep_newlines)
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f\ud800-\udfff{_FORMAT}]")
_UNSAFE_KEEP = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff{_FORMAT}]")
_PLAIN = re.compile(r"[\x20-\x7e\n\t]*")


_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe(text: Any, *, keep_newlines: bool = True) -> str:
    """``text`` with every terminal control and hiding/reordering character as a visible escape.

    Newlines and tabs stay unless ``keep_newlines`` is false (then ``\\n``, ``\\t`` are escaped
    too, for one-line fields). Not a string: its ``str()``. Plain printable ASCII is returned as is.
    """
    if not isinstance(text, str):
        text = str(text)
    if text.isascii() and _PLAIN.fullmatch(text):
        if keep_newlines or ("\n" not in text and "\t" not in text):
            return text
    return (_UNSAFE_KEEP if keep_newlines else _UNSAFE).sub(_escape, text)


class SafeFormatter(logging.Formatter):
    """A ``logging.Formatter`` whose every line is ``safe()``: message, arguments and exception
    text alike (a traceback quoting hostile code or an exception message with escapes in it)."""

    def __init__(self, *args: Any, inner: logging.Formatter | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inner = inner  # format with this one (e.g. a handler's own), then escape

    def format(self, record: logging.LogRecord) -> str:
        return safe(self.inner.format(record) if self.inner is not None else super().format(record))


def install_logging(level: int = logging.WARNING, stream: TextIO | None = None,
                    fmt: str = "kernelexec %(levelname)s %(name)s: %(message)s") -> None:
    """``logging.basicConfig`` with ``SafeFormatter`` on the root's handlers (also ones added before)."""
    logging.basicConfig(level=level, stream=stream or sys.stderr, format=fmt)
    for handler in logging.getLogger().handlers:
        # plain stream handlers (basicConfig's, or one set up before); a test harness's capture handlers keep theirs
        if type(handler) in (logging.StreamHandler, logging.FileHandler) and not isinstance(handler.formatter, SafeFormatter):
            handler.setFormatter(SafeFormatter(fmt) if handler.formatter is None else SafeFormatter(inner=handler.formatter))


def _excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    import traceback

    sys.stderr.write(safe("".join(traceback.format_exception(kind, value, tb))))


def install_excepthook() -> None:
    """An uncaught exception's traceback (its message may quote kernel or notebook text) escaped too."""
    sys.excepthook = _excepthook


def say(*parts: Any, file: TextIO | None = None, sep: str = " ", end: str = "\n", flush: bool = False) -> None:
    """``print`` for text that came from a notebook, a kernel or a file: each part ``safe()``."""
    print(*(safe(p) for p in parts), file=file if file is not None else sys.stdout, sep=sep, end=end, flush=flush)


__all__ = ["SafeFormatter", "install_excepthook", "install_logging", "safe", "say"]
