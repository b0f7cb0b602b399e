"""Turning one request's IOPub messages into an ``Execution``, whatever the kernel sends.

After nbclient's output handling (parent msg_id already matched by the caller, delayed
``clear_output``, ``display_id`` updates), with two differences that make it safe against a hostile
kernel (a cell holds the session key and can send anything):

- Every message is checked for the shape the Jupyter protocol gives it before anything is kept.
  A malformed one (no stream name, an unhashable ``display_id``, no ``data``, content that is not
  an object, a MIME key that is not a MIME type) is dropped and counted, never an exception: the
  cell still reaches the journal and the notebook, with a note saying what was dropped.
- The server keeps its own per-cell caps, whatever the kernel's cap did: each stream keeps at most
  ``stream_keep`` characters at its head and ``STREAM_TAIL`` at its tail in memory, the whole text
  streamed to a spill file (up to ``spill_cap``); rich outputs are limited in number and size.
  Text is gathered as chunk lists and joined once, so a flood costs linear time and bounded memory. A stream
  output is an object of its own each time the other stream (or a rich output) came in between: past
  ``max_stream_outputs`` of them, text joins its stream's last output instead (stdout and stderr alternating one
  character at a time made one object per character: ~2 million in one cell, hundreds of MB in the server).
"""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kernelexec.kernel.execution import CellError, Execution

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")
_MIME = re.compile(r"^[a-zA-Z0-9]+/[a-zA-Z0-9\-\+\.]+$")
_JSON_MIME = re.compile(r"^application/(.*\+)?json$")
STREAMS = ("stdout", "stderr")
STREAM_TAIL = 50_000  # characters of a capped stream's end kept in memory


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


class Malformed(ValueError):
    """A kernel message that does not have the shape the protocol gives it."""


@dataclass(frozen=True)
class Caps:
    """What the server keeps of one cell, whatever the kernel sends."""

    stream_keep: int = 1_100_000  # characters per stream kept whole in memory (the kernel's cap forwards 1,000,000)
    spill_cap: int = 64_000_000  # characters per stream written to the server's spill file
    max_outputs: int = 1_000  # rich outputs (display_data, execute_result, error) per cell
    max_stream_outputs: int = 1_000  # stream outputs per cell; past them text joins its stream's last output
    max_output_bytes: int = 32 * 1024 * 1024  # one rich output's data
    max_total_bytes: int = 128 * 1024 * 1024  # all rich outputs of a cell


class _Stream:
    """One stream of one cell: head in memory up to ``keep``, the tail after that, all of it on disk."""

    def __init__(self, name: str, caps: Caps, spill_path: Path | None) -> None:
        self.name = name
        self.caps = caps
        self.spill_path = spill_path
        self.head: list[str] = []
        self.head_len = 0
        self.tail: deque[str] = deque()
        self.tail_len = 0
        self.total = 0
        self.spilled = 0
        self._file: IO[str] | None = None

    @property
    def overflowed(self) -> bool:
        return self.total > self.head_len

    def add(self, text: str) -> str:
        """Take one chunk; return the part that goes into the cell's outputs (the head part)."""
        self.total += len(text)
        room = self.caps.stream_keep - self.head_len
        kept = text[:room] if room > 0 else ""
        if kept:
            self.head.append(kept)
            self.head_len += len(kept)
        if len(kept) < len(text):
            if self._file is None and self.spilled == 0:
                self._open_spill()
            self._spill(text[len(kept):])
            self.tail.append(text[len(kept):][-STREAM_TAIL:])
            self.tail_len += len(self.tail[-1])
            while self.tail_len - len(self.tail[0]) >= STREAM_TAIL:
                self.tail_len -= len(self.tail.popleft())
        return kept

    def _open_spill(self) -> None:
        if self.spill_path is None:
            return
        try:
            self.spill_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.spill_path, "w", encoding="utf-8", errors="replace")  # noqa: SIM115
            for part in self.head:
                self._spill(part)
        except OSError:
            self._file = None

    def _spill(self, text: str) -> None:
        if self._file is None:
            return
        room = self.caps.spill_cap - self.spilled
        try:
            if room > 0:
                self._file.write(text[:room])
                self.spilled += min(room, len(text))
            if room <= len(text):
                self._file.close()
                self._file = None
        except OSError:
            self._file = None

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def tail_text(self) -> str:
        text = "".join(self.tail)
        return text[-STREAM_TAIL:]

    def cut_note(self) -> str:
        where = f"; the whole stream is in {self.spill_path}" if self.spill_path is not None and self.spilled else ""
        return (f"\n[kernelexec: {self.total - self.head_len:,} more characters of {self.name} than the server keeps "
                f"per cell; their last {min(STREAM_TAIL, self.total - self.head_len):,} follow{where}]\n")


def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    raise Malformed(f"{what} is not text")


def _bundle(data: Any) -> tuple[dict[str, Any], int]:
    """A valid nbformat MIME bundle from a message's ``data``, and its size in characters."""
    if not isinstance(data, dict):
        raise Malformed("data is not an object")
    bundle: dict[str, Any] = {}
    size = 0
    for mime, value in data.items():
        if not isinstance(mime, str) or not _MIME.match(mime):
            raise Malformed(f"data has a key that is not a MIME type: {str(mime)[:40]!r}")
        if _JSON_MIME.match(mime) and not isinstance(value, str):
            size += len(json.dumps(value))
            bundle[mime] = value
        else:
            bundle[mime] = _text(value, f"data[{mime!r}]")
            size += len(bundle[mime])
    return bundle, size


def _metadata(content: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """An output's metadata (an object, else none) and its size in characters (it counts against the caps)."""
    meta = content.get("metadata", {})
    if not isinstance(meta, dict) or not meta:
        return {}, 0
    return meta, len(json.dumps(meta))


def _display_id(content: dict[str, Any]) -> str | None:
    transient = content.get("transient")
    if transient is None:
        return None
    if not isinstance(transient, dict):
        raise Malformed("transient is not an object")
    display_id = transient.get("display_id")
    if display_id is not None and not isinstance(display_id, str):
        raise Malformed("display_id is not a string")
    return display_id


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Collector:
    """One request's outputs. ``handle`` takes each message of the request (in order); ``finish``
    fills the Execution's streams and notes. Never raises for what the kernel sent."""

    def __init__(self, execution: Execution, caps: Caps | None = None, spill_dir: Path | None = None, tag: str = "cell") -> None:
        self.ex = execution
        self.caps = caps or Caps()
        self.clear_before_next = False
        self.display_index: dict[str, list[int]] = {}
        self.idle = False
        self.began = False
        self.streams = {name: _Stream(name, self.caps, spill_dir / f"{tag}-{name}.txt" if spill_dir else None)
                        for name in STREAMS}
        self._parts: dict[int, list[str]] = {}  # output index -> text chunks of a stream output
        self._last_of: dict[str, int] = {}  # stream name -> index of its last stream output
        self.rich_count = 0
        self.rich_bytes = 0
        self.dropped: dict[str, int] = {}  # why -> how many messages
        self.joined = 0  # stream chunks joined to their stream's last output, past max_stream_outputs

    def drop(self, why: str, count: int = 1) -> None:
        """``count`` messages of this cell left out, for ``why`` (said in the answer's notes)."""
        self.dropped[why] = self.dropped.get(why, 0) + count

    def handle(self, msg: Any) -> str | None:
        """Take one message; returns the stream text it added (for progress), if any."""
        try:
            return self._handle(msg)
        except Malformed as exc:
            self.drop(f"malformed {self._kind(msg)} message ({exc})")
        except Exception as exc:  # noqa: BLE001 - nothing a kernel sends may break a call
            self.drop(f"unreadable {self._kind(msg)} message ({type(exc).__name__})")
        return None

    @staticmethod
    def _kind(msg: Any) -> str:
        kind = msg.get("msg_type") if isinstance(msg, dict) else None
        return kind[:40] if isinstance(kind, str) else "?"

    def _handle(self, msg: Any) -> str | None:
        if not isinstance(msg, dict):
            raise Malformed("not an object")
        kind = msg.get("msg_type")
        content = msg.get("content")
        if not isinstance(content, dict):
            raise Malformed("content is not an object")
        self.began = True  # the kernel reported taking the request
        if kind == "status":
            self.idle = content.get("execution_state") == "idle"
        elif kind == "execute_input":
            self.ex.execution_count = _count(content.get("execution_count")) or self.ex.execution_count
        elif kind == "clear_output":
            if content.get("wait"):
                self.clear_before_next = True
            else:
                self._clear()
        elif kind == "stream":
            name = content.get("name")
            if name not in STREAMS:
                raise Malformed("stream name is not stdout or stderr")
            return self._stream(name, _text(content.get("text", ""), "text"))
        elif kind == "update_display_data":
            self._update(content)
        elif kind in ("display_data", "execute_result"):
            self._rich(kind, content)
        elif kind == "error":
            self._error(content)
        return None

    def _before_output(self) -> None:
        if self.clear_before_next:
            self._clear()

    def _stream(self, name: str, text: str) -> str:
        self._before_output()
        kept = self._streams_add(name, text)
        if kept:
            outputs = self.ex.outputs
            last = len(outputs) - 1
            if last >= 0 and last in self._parts and outputs[last].get("name") == name:
                self._parts[last].append(kept)
            elif len(self._parts) >= self.caps.max_stream_outputs and name in self._last_of:
                self._parts[self._last_of[name]].append(kept)  # out of order from here on, never one object per chunk
                self.joined += 1
            else:
                outputs.append({"output_type": "stream", "name": name, "text": ""})
                self._parts[last + 1] = [kept]
                self._last_of[name] = last + 1
        return text

    def _streams_add(self, name: str, text: str) -> str:
        return self.streams[name].add(text)

    def _room(self, size: int) -> bool:
        if self.rich_count >= self.caps.max_outputs:
            self.drop(f"rich output beyond {self.caps.max_outputs:,} per cell")
            return False
        if size > self.caps.max_output_bytes:
            self.drop(f"rich output over {self.caps.max_output_bytes:,} characters")
            return False
        if self.rich_bytes + size > self.caps.max_total_bytes:
            self.drop(f"rich outputs beyond {self.caps.max_total_bytes:,} characters per cell")
            return False
        return True

    def _rich(self, kind: str, content: dict[str, Any]) -> None:
        bundle, size = _bundle(content.get("data"))
        metadata, meta_size = _metadata(content)
        size += meta_size
        display_id = _display_id(content)
        self._before_output()
        if not self._room(size):
            return
        self.rich_count += 1
        self.rich_bytes += size
        out: dict[str, Any] = {"output_type": kind, "data": bundle, "metadata": metadata}
        if kind == "execute_result":
            out["execution_count"] = _count(content.get("execution_count"))
            self.ex.execution_count = out["execution_count"] or self.ex.execution_count
        if display_id:
            self.display_index.setdefault(display_id, []).append(len(self.ex.outputs))
        self.ex.outputs.append(out)

    def _update(self, content: dict[str, Any]) -> None:
        bundle, size = _bundle(content.get("data"))
        metadata, meta_size = _metadata(content)
        size += meta_size
        display_id = _display_id(content)
        self._before_output()
        indexes = self.display_index.get(display_id, []) if display_id else []
        for index in indexes:
            if size > self.caps.max_output_bytes or self.rich_bytes + size > self.caps.max_total_bytes:
                self.drop("display update over the per-cell size cap")
                return
            self.rich_bytes += size
            out = self.ex.outputs[index]
            out["data"] = bundle
            out["metadata"] = metadata

    def _error(self, content: dict[str, Any]) -> None:
        ename = content.get("ename")
        evalue = content.get("evalue", "")
        traceback = content.get("traceback", [])
        if not isinstance(ename, str) or not isinstance(evalue, str):
            raise Malformed("ename or evalue is not a string")
        if not isinstance(traceback, list) or not all(isinstance(t, str) for t in traceback):
            raise Malformed("traceback is not a list of strings")
        size = len(ename) + len(evalue) + sum(map(len, traceback))
        self._before_output()
        if not self._room(size):
            return
        self.rich_count += 1
        self.rich_bytes += size
        self.ex.error = CellError(ename, evalue, [strip_ansi(line) for line in traceback])
        self.ex.outputs.append(self.ex.error.output())

    def _clear(self) -> None:
        self.clear_before_next = False
        kept = [(i, o) for i, o in enumerate(self.ex.outputs) if o.get("output_type") == "error"]
        self.ex.outputs = [o for _, o in kept]
        self._parts = {}
        self._last_of = {}
        self.display_index.clear()

    def finish(self) -> None:
        """Join the gathered text once; add the caps' notes. Called once the request is over."""
        for index, parts in self._parts.items():
            self.ex.outputs[index]["text"] = "".join(parts)
        self._parts = {}
        self._last_of = {}
        for name, stream in self.streams.items():
            text = "".join(stream.head)
            stream.close()
            if stream.overflowed:
                note = stream.cut_note()
                text += note + stream.tail_text()
                self.ex.outputs.append({"output_type": "stream", "name": name, "text": note + stream.tail_text()})
                if stream.spilled:
                    self.ex.stream_files[name] = str(stream.spill_path)
                self.ex.notes.append(f"{name}: {stream.total:,} characters came from the kernel, past the server's per-cell "
                                     f"cap; it kept the first {stream.head_len:,} and the last {len(stream.tail_text()):,}"
                                     + (f", and {stream.spilled:,} in {stream.spill_path}" if stream.spilled else ""))
            setattr(self.ex, name, text)
        if self.joined:
            self.ex.notes.append(f"stdout and stderr took turns past {self.caps.max_stream_outputs:,} stream outputs; the "
                                 f"server joined {self.joined:,} later pieces to their stream's last output (their order "
                                 "between the two streams is lost, no text)")
        for why, count in self.dropped.items():
            self.ex.notes.append(f"the server dropped {count:,} {why}" if count > 1 else f"the server dropped a {why}")
