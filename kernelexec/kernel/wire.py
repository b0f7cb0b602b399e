"""The one door kernel messages come in by: every byte a kernel sends is untrusted input.

A cell holds its kernel's session key, so it can put any message on any channel, bypassing the
in-kernel output cap and packer. JSON's ``\\ud800`` escape decodes to a lone surrogate that no
UTF-8 writer accepts (the stdio transport, the notebook file), and ``NaN`` is not JSON at all.
``loads`` decodes a message part and cleans it: lone surrogates become U+FFFD (a valid pair is
joined into its character), ``NaN``/``Infinity`` become ``null``, and nesting deeper than any real
message is cut, and a part over ``MAX_PART_BYTES`` is refused before it is decoded. Local and
provisioned kernels get it as their wire session's ``unpack``
(``harden``), and their frames, read with bounds by ``zmtp``, are checked and decoded by ``deserialize``
(``checked``, called by ``channels.receive``); the gateway client
decodes its WebSocket frames with it (``loads_binary`` for a binary frame: a message with binary buffers, in
Jupyter's WebSocket layout, its parts checked before any is read).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Sequence
from hmac import compare_digest
from itertools import pairwise
from typing import Any

MAX_DEPTH = 64  # deeper structures than any Jupyter message has are replaced by a note
# One message part decodes to several times its size in objects: a kernel's honest messages (its stream
# cap forwards 1,000,000 characters; a large figure is a few MB) stay far below this.
MAX_PART_BYTES = 48 * 1024 * 1024
MAX_BUFFERS = 16  # binary buffers one message may carry: a fork's relay uses one, widgets a few
OFF_LOOP_BYTES = 256 * 1024  # a message larger than this is verified and decoded in a worker thread, off the event loop
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` as valid Unicode: a lone surrogate becomes U+FFFD, a surrogate pair its character."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def clean(value: Any, depth: int = 0) -> Any:
    """``value`` (decoded JSON) with every string, keys included, made valid Unicode, and no NaN or infinity."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if depth >= MAX_DEPTH:
        return "[kernelexec: nested too deep]" if isinstance(value, (dict, list)) else value
    if isinstance(value, dict):
        return {clean_text(k) if isinstance(k, str) else k: clean(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v, depth + 1) for v in value]
    return value


def _no_constant(name: str) -> None:
    return None  # NaN, Infinity, -Infinity: not JSON; null instead


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None  # 1e999 overflows to inf: not JSON either


# one decoder for every part: json.loads with hooks would build a new decoder (and scanner) per call
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


def loads(data: bytes | memoryview | str) -> Any:
    """Decode one JSON message part from a kernel (see the module docstring). Raises ValueError
    for what is not JSON or is nested beyond the decoder's recursion limit."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > MAX_PART_BYTES:
        raise ValueError(f"a kernel message part of {len(raw):,} bytes (more than {MAX_PART_BYTES:,})")
    try:
        value = _DECODER.decode(raw.decode("utf-8", "replace"))
    except RecursionError:
        raise ValueError("a kernel message nested too deep to decode") from None  # not its thousands of frames
    # the common case costs two C-level scans: no "\\u" escape, fewer brackets than the depth limit
    escaped = b"\\u" in raw and _ESCAPED_SURROGATE.search(raw) is not None
    deep = raw.count(b"[") + raw.count(b"{") >= MAX_DEPTH and _depth_exceeds(value)
    if escaped or deep:
        value = clean(value)
    return value


def _depth_exceeds(value: Any, limit: int = MAX_DEPTH) -> bool:
    """True when ``value`` nests deeper than ``limit`` (checked iteratively; cheap for real messages)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth >= limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))
    return False


def binary_message(msg: dict[str, Any], buffers: Sequence[bytes | memoryview], default: Any = None) -> bytes:
    """``msg`` and its binary ``buffers`` as one WebSocket frame in Jupyter's (pre-subprotocol) binary layout, which
    jupyter_server 1.x and 2.x (so the Kernel Gateway and Enterprise Gateway) read back with
    ``deserialize_binary_message``: the part count, each part's offset (32-bit, big-endian), the JSON, the buffers.
    The one copy is the join; the buffers are never encoded."""
    parts: list[bytes | memoryview] = [json.dumps(msg, default=default).encode(), *buffers]
    offsets = [4 * (len(parts) + 1)]
    for part in parts[:-1]:
        offsets.append(offsets[-1] + memoryview(part).nbytes)
    return b"".join([struct.pack(f"!{len(parts) + 1}I", len(parts), *offsets), *parts])


def loads_binary(frame: bytes) -> Any:
    """A binary WebSocket frame from a kernel's server (``binary_message``'s layout), decoded: the JSON part through
    ``loads``, the buffers as read-only views of ``frame`` (not copied, never decoded) in ``msg["buffers"]``.
    Raises ValueError for a layout that does not hold together (offsets out of order or out of the frame)."""
    view = memoryview(frame)
    if len(view) < 8:
        raise ValueError("a binary kernel message shorter than its header")
    (count,) = struct.unpack_from("!I", view)
    if not 1 <= count <= MAX_BUFFERS + 1 or len(view) < 4 * (count + 1):
        raise ValueError(f"a binary kernel message of {count} parts")
    offsets = [*struct.unpack_from(f"!{count}I", view, 4), len(view)]
    if offsets[0] != 4 * (count + 1) or any(a > b for a, b in pairwise(offsets)):
        raise ValueError("a binary kernel message whose parts are out of order or out of the frame")
    msg = loads(view[offsets[0]:offsets[1]])
    if not isinstance(msg, dict):
        raise ValueError("a binary kernel message whose JSON part is not an object")
    msg["buffers"] = [view[a:b].toreadonly() for a, b in pairwise(offsets[1:])]
    return msg


def harden(session: Any) -> Any:
    """Make a ``jupyter_client.session.Session`` decode with ``loads``; returns it."""
    session.unpack = loads
    return session


def shared_context() -> Any:
    """The one ``zmq.asyncio`` context of this process, for every kernel manager and its clients (as
    jupyter_client's MultiKernelManager shares one). jupyter_client's default, a context for each lone manager and
    each client, cost a kernel four zmq threads and a share of its 24 file descriptors: a process under the common
    limit of 1,024 open files hit EMFILE near 40 kernels (tests/test_open_files.py)."""
    import zmq.asyncio

    return zmq.asyncio.Context.instance()


async def checked(session: Any, frames: Sequence[bytes]) -> dict[str, Any]:
    """One message's frames from a kernel, checked and decoded by ``deserialize``; a large one off the event loop."""
    if sum(len(frame) for frame in frames) > OFF_LOOP_BYTES:
        return await _deserialize_off_loop(session, frames)
    return deserialize(session, frames)


def deserialize(session: Any, frames: Sequence[bytes]) -> dict[str, Any]:
    """One zmq message from a kernel (its identities, ``<IDS|MSG>``, signature, four JSON parts, buffers) as a message
    dict, checked as jupyter_client's ``Session.deserialize`` checks it: signed with the session's key (HMAC, compared
    in constant time), its signature never seen before (the session's replay history). Unlike it, the header's and
    parent header's dates stay the strings the kernel sent (parsing them cost ~0.2 ms a call, and nothing here reads
    them), and no protocol-version adapter runs: kernelexec's kernels speak protocol 5. Raises ValueError (or
    KeyError, TypeError) for a message that does not hold together; callers drop it."""
    parts = _checked_history(session, frames)
    _verify(session, parts)
    return _decode(parts)


async def _deserialize_off_loop(session: Any, frames: Sequence[bytes]) -> dict[str, Any]:
    """``deserialize`` for a large message: the replay history checked on the loop (as every message's, in the
    same order), the signature's HMAC and the JSON decoding in a worker thread. A 1 MiB stream message cost the
    event loop ~11 ms (up to 50 ms under load) of HMAC and decoding, and a flood of them made every other
    session's call wait behind one per turn of the loop (a p99 over 1 s in CI). A wait cancelled meanwhile returns at
    once (a stop's bounded wait must not run on for a hostile kernel's huge reply): the thread's work is abandoned
    and the message dropped, as a cancelled wait drops it anyway."""
    import anyio.to_thread

    parts = _checked_history(session, frames)

    def verified() -> dict[str, Any]:
        _verify(session, parts)
        return _decode(parts)

    return await anyio.to_thread.run_sync(verified, abandon_on_cancel=True)


def _checked_history(session: Any, frames: Sequence[bytes]) -> list[bytes]:
    """The message's parts after its identities; its signature checked against, then added to, the session's replay
    history (jupyter_client's order: added before the signature is verified)."""
    _, parts = session.feed_identities(frames)
    if len(parts) < 5:
        raise ValueError(f"a kernel message of {len(parts)} parts (at least 5)")
    if session.auth is not None:
        signature = parts[0]
        if not signature:
            raise ValueError("an unsigned kernel message")
        if signature in session.digest_history:
            raise ValueError("a kernel message replayed (its signature seen before)")
        session._add_digest(signature)  # noqa: SLF001 - the session's own replay history, as its deserialize keeps it
    return list(parts)


def _verify(session: Any, parts: Sequence[bytes]) -> None:
    """The signature checked (HMAC, compared in constant time). Thread-safe: ``sign`` works on a copy of the key's HMAC."""
    if session.auth is not None and not compare_digest(parts[0], session.sign(parts[1:5])):
        raise ValueError("a kernel message with an invalid signature")


def _decode(parts: Sequence[bytes]) -> dict[str, Any]:
    header = loads(parts[1])
    if not isinstance(header, dict):
        raise ValueError("a kernel message whose header is not an object")
    return {
        "header": header,
        "msg_id": header["msg_id"],
        "msg_type": header["msg_type"],
        "parent_header": loads(parts[2]),
        "metadata": loads(parts[3]),
        "content": loads(parts[4]),
        "buffers": [memoryview(b) for b in parts[5:]],
    }
