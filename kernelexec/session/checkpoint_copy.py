"""A checkpoint from one kernel to another (a fork): the source kernel names its files, the bytes travel,
the fork's kernel puts them in place.

The source kernel finishes its saves and lists the files a fork needs (``_kernelexec_checkpoint_export``:
names and sizes, checked here against plain names and the cap). How the bytes travel is chosen once, by the
backends' locality (``Kernel.checkpoint_on_this_host``):

- both kernels' checkpoints are directories on this host (local kernels): the server copies exactly the
  announced files as opaque bytes (``_copy_files``: regular files only, no link followed at either end, no
  sparse file, never more than announced, never read as anything). About 1 s for 200 MB.
- otherwise (a gateway's kernels, whose files the server cannot reach): the relay. Each kernel serves a comm
  (startup/checkpoint.py's ``serve_relay``, target ``RELAY_TARGET``); the source kernel hands out pieces of at
  most ``CHUNK`` bytes as binary buffers (zmq frames; a gateway's binary WebSocket frames), the server passes
  each on, unread and not copied, to the fork's kernel. It checks only what it relays: each piece is the one
  buffer of exactly the size it asked for. Base64 in JSON made this 50 s for 200 MB; raw buffers, a few.

Either way the files land as ``<name>.part`` and the fork's kernel renames them into place, the manifest
last (``_kernelexec_checkpoint_received``); no host process unpickles or trusts a byte of them (the host rule).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import anyio

from kernelexec.errors import InvalidRequest
from kernelexec.kernel.driver import Kernel

# bytes per piece: its binary WebSocket frame (a small JSON header before it) stays under the 10 MiB a gateway's
# tornado accepts per message (websocket_max_message_size)
CHUNK = 8 * 1024 * 1024
WINDOW = 3  # relay requests in flight per kernel: 3 pieces of CHUNK held by the server at most, each way
RELAY_TARGET = "kernelexec.checkpoint"  # startup/checkpoint.py's COMM_TARGET
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]{0,199}")
SPARSE_SLACK = 1 << 20  # bytes a file's size may exceed its allocated blocks before it counts as sparse
COPY_BUFFER = 64 << 20  # bytes one sendfile call of the direct copy moves at most


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
    if len({name for name, _ in files}) != len(files):
        raise InvalidRequest("the source kernel named a checkpoint file twice")
    if total > max_bytes or len(files) > 100_000:
        raise InvalidRequest(f"the checkpoint is larger than {max_bytes:,} bytes or has too many files")
    return files


def _piece(answer: Any, buffers: list[memoryview], expected: int) -> memoryview:
    """One piece from the source kernel (untrusted): its one binary buffer, exactly ``expected`` bytes, never read."""
    if not (isinstance(answer, dict) and answer.get("bytes") == expected and len(buffers) == 1
            and buffers[0].nbytes == expected):
        why = answer.get("error") if isinstance(answer, dict) and answer.get("error") else f"{len(buffers)} buffers"
        raise InvalidRequest(f"the source kernel sent a checkpoint piece that is not {expected:,} bytes ({str(why)[:160]})")
    return buffers[0]


async def copy_checkpoint(source: Kernel, target: Kernel, *, source_dir: Path, target_dir: Path,
                          max_bytes: int, timeout: float) -> int:
    """Every file of ``source``'s checkpoint (its saves finished first) into ``target``'s: copied directly when
    both are directories on this host, else relayed through the kernels; the manifest put in place last.
    Returns the bytes copied. ``target`` must be a new kernel of the fork."""
    files = _files(await source.evaluate("_kernelexec_checkpoint_export()", timeout=timeout), max_bytes)
    if source.checkpoint_on_this_host and target.checkpoint_on_this_host:
        copied = await anyio.to_thread.run_sync(lambda: _copy_files(files, source_dir, target_dir))
    else:
        copied = await _relay(files, source, target, timeout=timeout)
    if files:
        done = await target.evaluate(f"_kernelexec_checkpoint_received({json.dumps([n for n, _ in files])})",
                                     timeout=timeout)
        if not (isinstance(done, dict) and done.get("received") == len(files)):
            raise InvalidRequest(f"the fork's kernel did not take its checkpoint: {str(done)[:200]}")
    return copied


def _copy_files(files: list[tuple[str, int]], source_dir: Path, target_dir: Path) -> int:
    """The announced files of a kernel-written directory copied as opaque bytes to ``<name>.part`` in the fork's:
    a symlink (at either end), a special file, a sparse file or one that is not its announced size is refused
    (``InvalidRequest``), and never more than the announced (capped) bytes are written."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    src_dir = os.open(source_dir, flags | os.O_DIRECTORY)
    copied = 0
    try:
        os.makedirs(target_dir, mode=0o700, exist_ok=True)
        dst_dir = os.open(target_dir, flags | os.O_DIRECTORY)
        owner = os.fstat(dst_dir)  # the fork's kernel's uid when it runs as its own (a root server): its files
        try:
            for name, size in files:
                try:
                    fd = os.open(name, flags | os.O_NONBLOCK, dir_fd=src_dir)
                except OSError as exc:  # ELOOP: a link planted after the export
                    raise InvalidRequest(f"checkpoint file {name!r} refused: not a regular file ({exc.strerror})") from None
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        raise InvalidRequest(f"checkpoint file {name!r} refused: not a regular file")
                    if st.st_size != size:
                        raise InvalidRequest(f"checkpoint file {name!r} refused: {st.st_size:,} bytes, "
                                             f"not the {size:,} bytes its kernel announced")
                    if st.st_blocks * 512 + SPARSE_SLACK < size:  # holes: the copy would fill them on our disk
                        raise InvalidRequest(f"checkpoint file {name!r} refused: a sparse file (no save writes one)")
                    out = os.open(name + ".part", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                  0o600, dir_fd=dst_dir)
                    try:  # in the OS, file to file (sendfile: the bytes never pass through this process)
                        if (owner.st_uid, owner.st_gid) != (os.geteuid(), os.getegid()):
                            os.fchown(out, owner.st_uid, owner.st_gid)
                        offset = 0
                        while offset < size and (sent := os.sendfile(out, fd, offset, min(size - offset, COPY_BUFFER))):
                            offset += sent  # what was checked, never what the kernel appends meanwhile
                        copied += offset
                    finally:
                        os.close(out)
                finally:
                    os.close(fd)
        finally:
            os.close(dst_dir)
    finally:
        os.close(src_dir)
    return copied


async def _open_relay(kernel: Kernel, *, timeout: float) -> str:
    """A comm to ``kernel``'s relay (``RELAY_TARGET``), open once it said so; its id."""
    comm_id = uuid.uuid4().hex
    answer, _ = await kernel.comm("comm_open", {"comm_id": comm_id, "target_name": RELAY_TARGET, "data": {}},
                                  timeout=timeout)
    if not (isinstance(answer, dict) and answer.get("ready") is True):
        raise InvalidRequest(f"a kernel did not open its checkpoint relay: {str(answer)[:200]}")
    return comm_id


async def _relay(files: list[tuple[str, int]], source: Kernel, target: Kernel, *, timeout: float) -> int:
    """The announced files read out by ``source`` piece by piece and passed on, checked but unread, to ``target``.
    Pieces are read from the source while the target writes earlier ones (two kernels, two processes), up to
    ``WINDOW`` requests in flight on each kernel: a busy machine's scheduling gaps do not add up per piece."""
    pieces = [(name, offset, min(CHUNK, size - offset)) for name, size in files for offset in range(0, max(size, 1), CHUNK)]
    send, receive = anyio.create_memory_object_stream[tuple[str, int, int, memoryview]](WINDOW)
    opened: list[tuple[Kernel, str]] = []

    async def read_out(comm_id: str) -> None:
        asked: deque[tuple[str, int, int, str]] = deque()
        async with send:
            for i, (name, offset, n) in enumerate(pieces):
                request = {"op": "read", "name": name, "offset": offset, "size": n}
                msg_id = await source.send_comm("comm_msg", {"comm_id": comm_id, "data": request}, within=timeout)
                asked.append((name, offset, n, msg_id))
                while asked and (len(asked) >= WINDOW or i == len(pieces) - 1):
                    name_, offset_, n_, asked_id = asked.popleft()
                    answer, buffers = await source.comm_answer(asked_id, timeout=timeout)
                    await send.send((name_, offset_, n_, _piece(answer, buffers, n_)))

    async def check_written(msg_id: str, n: int) -> int:
        done, _ = await target.comm_answer(msg_id, timeout=timeout)
        if not (isinstance(done, dict) and done.get("bytes") == n):
            raise InvalidRequest(f"the fork's kernel did not take its checkpoint: {str(done)[:200]}")
        return n

    copied = 0
    try:
        for kernel in (source, target):
            opened.append((kernel, await _open_relay(kernel, timeout=timeout)))
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_out, opened[0][1])
            written: deque[tuple[str, int]] = deque()
            async with receive:
                async for name, offset, n, data in receive:
                    request = {"comm_id": opened[1][1], "data": {"op": "write", "name": name, "offset": offset}}
                    written.append((await target.send_comm("comm_msg", request, [data], within=timeout), n))
                    if len(written) >= WINDOW:
                        copied += await check_written(*written.popleft())
            while written:
                copied += await check_written(*written.popleft())
    except BaseExceptionGroup as group:  # the first failure, as the caller would see it without the pipeline
        first: BaseException = group
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    finally:
        with anyio.CancelScope(shield=True):
            for kernel, comm_id in opened:  # the kernels forget the comms (their answer: none, once idle)
                with contextlib.suppress(Exception):
                    await kernel.comm("comm_close", {"comm_id": comm_id, "data": {}}, timeout=5)
    return copied
