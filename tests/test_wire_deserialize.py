"""``wire.deserialize``: a local kernel's zmq frames checked and decoded without jupyter_client's ``deserialize``.
The frames are made by jupyter_client's own ``Session`` (what ipykernel uses to send); what a kernel can forge is
refused as jupyter_client refuses it: no signature, a wrong one, a replayed one, too few parts, a header that is
not an object. Dates stay the strings the kernel sent; parts still go through ``wire.loads``."""

from __future__ import annotations

import time

import anyio
import pytest
from jupyter_client.session import Session

from kernelexec.kernel import wire


def _pair() -> tuple[Session, Session]:
    """The kernel's session and ours, one key."""
    kernel = Session(key=b"k" * 32)
    ours = wire.harden(Session(key=b"k" * 32))
    return kernel, ours


def _frames(kernel: Session, content: object, **kw: object) -> list[bytes]:
    msg = kernel.msg("execute_result", content, parent={"msg_id": "p1", "msg_type": "execute_request",
                                                         "date": "2026-12-06T10:00:00.000000Z"}, **kw)
    return [b"ident", *[bytes(p) for p in kernel.serialize(msg, ident=None)]]


def test_a_signed_message_decodes_as_jupyter_clients_does_but_dates_stay_strings() -> None:
    kernel, ours = _pair()
    frames = _frames(kernel, {"data": {"text/plain": "1"}, "execution_count": 1}, metadata={"m": 1})
    got = wire.deserialize(ours, frames)
    theirs = Session(key=b"k" * 32).deserialize(Session().feed_identities(frames)[1])
    assert got["content"] == theirs["content"] and got["metadata"] == theirs["metadata"] == {"m": 1}
    assert got["msg_id"] == theirs["msg_id"] and got["msg_type"] == "execute_result"
    assert got["parent_header"]["msg_id"] == "p1" and got["buffers"] == []
    assert isinstance(got["header"]["date"], str) and got["parent_header"]["date"] == "2026-12-06T10:00:00.000000Z"


def test_parts_go_through_loads() -> None:
    kernel, ours = _pair()
    frames = _frames(kernel, {"text": "x"})
    frames[-1] = b'{"text": "a\\ud800b", "n": NaN}'  # re-signed below: the kernel holds the key
    frames[2] = kernel.sign(frames[3:7])
    got = wire.deserialize(ours, frames)
    assert got["content"] == {"text": "a\ufffdb", "n": None}


def test_forged_unsigned_replayed_and_malformed_messages_are_refused() -> None:
    kernel, ours = _pair()
    good = _frames(kernel, {"a": 1})
    wire.deserialize(ours, good)
    with pytest.raises(ValueError, match="replayed"):
        wire.deserialize(ours, good)
    forged = _frames(kernel, {"a": 2})
    forged[-1] = b'{"a": 3}'
    with pytest.raises(ValueError, match="invalid signature"):
        wire.deserialize(ours, forged)
    unsigned = _frames(kernel, {"a": 4})
    unsigned[2] = b""
    with pytest.raises(ValueError, match="unsigned"):
        wire.deserialize(ours, unsigned)
    with pytest.raises(ValueError, match="parts"):
        wire.deserialize(ours, [b"<IDS|MSG>", b"sig", b"{}"])
    not_object = _frames(kernel, {"a": 5})
    not_object[3] = b"[1]"
    not_object[2] = kernel.sign(not_object[3:7])
    with pytest.raises(ValueError, match="not an object"):
        wire.deserialize(ours, not_object)
    outsider = Session(key=b"x" * 32)  # a message signed with another key
    with pytest.raises(ValueError, match="invalid signature"):
        wire.deserialize(ours, _frames(outsider, {"a": 6}))


def test_buffers_come_through_as_views() -> None:
    kernel, ours = _pair()
    msg = kernel.msg("comm_msg", {"data": {}})
    frames = [bytes(p) for p in kernel.serialize(msg)] + [b"\x00\x01"]
    frames[1] = kernel.sign(frames[2:6])
    got = wire.deserialize(ours, frames)
    assert [bytes(b) for b in got["buffers"]] == [b"\x00\x01"]


@pytest.mark.anyio
async def test_a_cancelled_wait_does_not_wait_for_a_large_messages_decoding() -> None:
    """A large message is decoded in a worker thread; a wait cancelled meanwhile (a stop's bounded wait for a hostile
    kernel's huge reply) returns at once, and the decoding is abandoned, not waited for."""
    kernel, ours = _pair()
    frames = _frames(kernel, {"data": {"text/plain": [0.5] * 4_000_000}})  # 20 MB: about a second to decode here
    started = time.monotonic()
    wire.deserialize(_pair()[1], frames)  # the same work, in this thread, on a session of its own (replay history)
    decoding = time.monotonic() - started
    started = time.monotonic()
    with anyio.move_on_after(0.05) as scope:
        await wire._deserialize_off_loop(ours, frames)
    waited = time.monotonic() - started
    assert scope.cancelled_caught and waited < decoding / 2, f"waited {waited:.2f} s for a {decoding:.2f} s decode"
