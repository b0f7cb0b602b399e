"""Binary kernel messages (``wire.binary_message``, ``wire.loads_binary``): the frames a fork's relay sends and
reads through a gateway. What comes back from a gateway is a kernel's, untrusted: a frame whose layout does not
hold together is refused before any part is read. The framing and masking of our own frames
(``gateway_channels._binary_frame``) is RFC 6455's, byte for byte."""

from __future__ import annotations

import os
import struct

import pytest
from jupyter_server.services.kernels.connection.base import deserialize_binary_message
from websocket import ABNF

from kernelexec.backends.gateway_channels import _binary_frame
from kernelexec.kernel import wire


def test_a_binary_message_is_what_jupyter_server_reads_and_what_we_read_back() -> None:
    msg = {"header": {"msg_id": "1", "msg_type": "comm_msg"}, "parent_header": {}, "content": {"data": {"op": "write"}},
           "metadata": {}, "channel": "shell"}
    pieces = [os.urandom(1000), b"", os.urandom(3)]
    frame = wire.binary_message(msg, pieces)
    theirs = deserialize_binary_message(frame)
    assert [bytes(b) for b in theirs["buffers"]] == pieces and theirs["content"] == msg["content"]
    ours = wire.loads_binary(frame)
    assert [bytes(b) for b in ours["buffers"]] == pieces and ours["channel"] == "shell"
    assert all(b.readonly for b in ours["buffers"])


@pytest.mark.parametrize("frame", [
    b"",  # nothing
    struct.pack("!I", 0) + b"\0" * 8,  # no JSON part
    struct.pack("!I", 10_000) + b"\0" * 8,  # more parts than any message has
    struct.pack("!3I", 2, 12, 99) + b"{}",  # a buffer starting past the frame's end
    struct.pack("!3I", 2, 14, 13) + b"{}x",  # parts out of order
    struct.pack("!3I", 2, 4, 12) + b"{}",  # the JSON part inside the header
    struct.pack("!2I", 1, 8) + b"[1, 2]",  # JSON that is not a message
])
def test_a_binary_frame_that_does_not_hold_together_is_refused(frame: bytes) -> None:
    with pytest.raises(ValueError):
        wire.loads_binary(frame)


@pytest.mark.parametrize("size", [0, 1, 3, 5, 125, 126, 65535, 65536, 8 << 20, (8 << 20) + 3])
def test_our_binary_frames_are_websocket_clients_byte_for_byte(size: int) -> None:
    """RFC 6455 framing and masking, faster: the same bytes websocket-client makes for the same key."""
    data, key = os.urandom(size), os.urandom(4)
    ours, theirs = _binary_frame(data), ABNF.create_frame(data, ABNF.OPCODE_BINARY)
    ours.get_mask_key = theirs.get_mask_key = lambda n: key
    assert bytes(ours.format()) == theirs.format()
