"""A checkpoint from one kernel to another (a fork), through the kernels themselves.

The source kernel reads its own checkpoint files and hands them out in base64 pieces of at most ``CHUNK``
bytes over the kernel protocol (``_kernelexec_checkpoint_read``); the server passes each piece on, unread,
to the target kernel (``_kernelexec_checkpoint_receive``), which writes it into its own checkpoint
directory. So the one mechanism works for local kernels and for a gateway's, whose files the server
cannot reach, and no host process opens a file a kernel wrote (the host rule). The server checks only
what it relays: names, sizes, the pieces' lengths and alphabet, the total against the cap.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio

from kernelexec.errors import InvalidRequest
from kernelexec.kernel.driver import Kernel

CHUNK = 4 * 1024 * 1024  # raw bytes per piece: 5.6 MB of base64, under a gateway WebSocket's 10 MiB message cap
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]{0,199}")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


def _files(answer: Any, max_bytes: int) -> list[tuple[str, int]]:
    """The source kernel's list of files (untrusted), checked: plain names, sizes, the total under the cap."""
    found = answer.get("files") if isinstance(answer, dict) else None
    if not isinstance(found, list):
        raise InvalidRequest(f"the source kernel did not export its checkpoint: {str(answer)[:200]}")
    files: list[tuple[str, int]] = []
    for item in found:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], int)
                and _NAME.fullmatch(item[0]) and ".." not in item[0] and item[1] >= 0):
            raise InvalidRequest(f"checkpoint file {str(item)[:80]!r} refused: not one kernelexec writes")
        files.append((item[0], item[1]))
    total = sum(size for _, size in files)
    if total > max_bytes or len(files) > 100_000:
        raise InvalidRequest(f"the checkpoint is larger than {max_bytes:,} bytes or has too many files")
    return files


def _piece(answer: Any, expected: int) -> str:
    """One base64 piece from the source kernel (untrusted): a string of exactly the length ``expected`` bytes make."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, str) or len(data) != 4 * ((expected + 2) // 3) or not _BASE64.fullmatch(data):
        raise InvalidRequest(f"the source kernel sent a checkpoint piece that is not {expected:,} bytes of base64")
    return data


async def copy_checkpoint(source: Kernel, target: Kernel, *, max_bytes: int, timeout: float) -> int:
    """Every file of ``source``'s checkpoint (its saves finished first) into ``target``'s, piece by piece; the
    manifest put in place last. The next piece is read from the source while the target writes the last (two
    kernels, two processes); one piece waits at most. Returns the bytes copied. ``target`` must be a new kernel
    of the fork."""
    files = _files(await source.evaluate("_kernelexec_checkpoint_export()", timeout=timeout), max_bytes)
    pieces = [(name, offset, min(CHUNK, size - offset)) for name, size in files for offset in range(0, max(size, 1), CHUNK)]
    send, receive = anyio.create_memory_object_stream[tuple[str, int, int, str]](1)

    async def read_out() -> None:
        async with send:
            for name, offset, n in pieces:
                data = await source.evaluate(f"_kernelexec_checkpoint_read({json.dumps(name)}, {offset}, {n})",
                                             timeout=timeout)
                await send.send((name, offset, n, _piece(data, n)))

    copied = 0
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_out)
            async with receive:
                async for name, offset, n, data in receive:
                    done = await target.evaluate(f"_kernelexec_checkpoint_receive({json.dumps(name)}, {offset}, "
                                                 f"{json.dumps(data)})", timeout=timeout)
                    if not (isinstance(done, dict) and done.get("bytes") == n):
                        raise InvalidRequest(f"the fork's kernel did not take its checkpoint: {str(done)[:200]}")
                    copied += n
    except BaseExceptionGroup as group:  # the first failure, as the caller would see it without the pipeline
        first: BaseException = group
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    if files:
        done = await target.evaluate(f"_kernelexec_checkpoint_received({json.dumps([n for n, _ in files])})",
                                     timeout=timeout)
        if not (isinstance(done, dict) and done.get("received") == len(files)):
            raise InvalidRequest(f"the fork's kernel did not take its checkpoint: {str(done)[:200]}")
    return copied
