"""The session resources: notebooks, produced files and working-directory files, read and listed.

``register(mcp, sessions)`` adds three resource templates and a ``resources/list`` middleware.
MCPServer lists only static resources and its list handler sees no request, so the middleware
appends each visible session's concrete resources to the SDK's own answer (its wire envelope
untouched). Whose sessions: stdio and in-memory serve one client, so all of them; a legacy HTTP
client, the session of its Mcp-Session-Id; a stateless HTTP client cannot be told apart from the
others, so none (listing would hand it other clients' handles). Listing is bounded work off the
event loop, whatever a session's code created.
"""

from __future__ import annotations

import heapq
import os
import stat
from mimetypes import guess_type
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

import anyio
from anyio import CapacityLimiter, to_thread
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from mcp_types import Resource

from kernelexec.errors import KernelexecError
from kernelexec.server.auth import current_principal
from kernelexec.server.render import EXTENSIONS, TEXT_EXTENSIONS
from kernelexec.session.manager import SessionManager
from kernelexec.session.session import Session

MAX_RESOURCE_FILE = 10 * 1024 * 1024  # largest file served as a resource: its answer is encoded on the event loop
MAX_LISTED_FILES = 200  # per directory of a session: the newest this many
MAX_EXAMINED_ENTRIES = 5000  # per directory: a kernel can create millions; the listing looks at this many
WORK_TEXT = TEXT_EXTENSIONS | {"csv", "py", "md", "log", "tsv"}


def newest_files(directory: Path) -> tuple[list[tuple[str, os.stat_result]], int, bool]:
    """The newest regular, non-hidden files among the first ``MAX_EXAMINED_ENTRIES`` entries of
    ``directory``: (name, lstat) newest first, how many regular files were seen, and whether the
    directory has entries beyond those examined. Links are never followed (the kernel owns
    work/), and only files that are regular by their directory entry are lstat-ed."""
    newest: list[tuple[float, str, os.stat_result]] = []  # a min-heap of the newest kept so far
    seen = examined = 0
    more = False
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if examined >= MAX_EXAMINED_ENTRIES:
                    more = True
                    break
                examined += 1
                try:
                    if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                seen += 1
                item = (st.st_mtime, entry.name, st)
                if len(newest) < MAX_LISTED_FILES:
                    heapq.heappush(newest, item)
                elif item[:2] > newest[0][:2]:
                    heapq.heapreplace(newest, item)
    except OSError:
        pass
    newest.sort(key=lambda item: item[:2], reverse=True)
    return [(name, st) for _, name, st in newest], seen, more

def shown(what: str, listed: int, seen: int, more: bool) -> str:
    """What a listing of a directory shows, when it is not everything."""
    if more:
        return (f"{what} has more than {MAX_EXAMINED_ENTRIES:,} entries: listed are the newest {listed} of the "
                f"{seen:,} files among the first {MAX_EXAMINED_ENTRIES:,} examined; read any other by name")
    if listed < seen:
        return f"{what}: listed are the newest {listed} of its {seen:,} files; read any other by name"
    return ""

def session_resources(handle: str, outputs: Path, work: Path) -> list[Resource]:
    """Runs in a worker thread: bounded work whatever the session's code created."""
    produced, produced_seen, produced_more = newest_files(outputs)
    written, written_seen, written_more = newest_files(work)
    notes = [n for n in (shown("outputs/", len(produced), produced_seen, produced_more),
                         shown("The working directory", len(written), written_seen, written_more)) if n]
    found = [
        Resource(
            uri=f"kernelexec://sessions/{handle}/notebook.ipynb", name="notebook.ipynb",
            title=f"Notebook of session {handle}",
            description="; ".join(["Every call of this session, as a notebook", *notes]),
            mime_type="application/x-ipynb+json",
        )
    ]
    produced_note = f" ({notes[0]})" if produced_seen > len(produced) or produced_more else ""
    for name, st in produced:
        mime = next((m for m, ext in EXTENSIONS.items() if ext == name.rsplit(".", 1)[-1]), None) if "." in name else None
        found.append(
            Resource(
                uri=f"kernelexec://sessions/{handle}/files/{quote(name, safe='')}", name=name,
                title=f"{name} (session {handle})", description="A file this session produced" + produced_note,
                mime_type=mime or guess_type(name)[0] or "application/octet-stream", size=st.st_size,
            )
        )
    written_note = f" ({notes[-1]})" if written_seen > len(written) or written_more else ""
    for name, st in written:
        found.append(
            Resource(
                uri=f"kernelexec://sessions/{handle}/work/{quote(name, safe='')}", name=name,
                title=f"{name} (working directory of session {handle})",
                description="A file the session's code wrote" + written_note, size=st.st_size,
                mime_type=guess_type(name)[0] or "application/octet-stream",
            )
        )
    return found

def listing(visible: list[tuple[str, Path, Path]]) -> list[dict[str, Any]]:
    return [
        r.model_dump(by_alias=True, mode="json", exclude_none=True)
        for handle, outputs, work in visible
        for r in session_resources(handle, outputs, work)
    ]


def read_capped(fh: BinaryIO, name: str) -> bytes:
    """An open file's bytes, refused past ``MAX_RESOURCE_FILE`` (measured on the open file, not its path)."""
    size = os.fstat(fh.fileno()).st_size
    if size > MAX_RESOURCE_FILE:
        raise ResourceError(f"{name!r} is {size:,} bytes; resources serve at most {MAX_RESOURCE_FILE:,} (the whole file is "
                            "kept on the server, at the path the answer gave)")
    return fh.read(MAX_RESOURCE_FILE)


def register(mcp: MCPServer, sessions: SessionManager) -> None:
    """Add the session resources to ``mcp``."""
    listing_threads: list[CapacityLimiter] = []  # listings run off the loop, at most two at a time (made on the loop)

    def session_file(session: str, name: str) -> Path:
        try:
            s = sessions.get(session, owner=current_principal())
        except KernelexecError as exc:
            raise ResourceNotFoundError(str(exc)) from exc
        try:
            path = (s.dirs.outputs / name).resolve()
            found = path.parent == s.dirs.outputs.resolve() and path.is_file()
        except (OSError, ValueError):  # a name no file can have (too long, a NUL): no such file either
            found = False
        if not found:
            raise ResourceNotFoundError(f"no file {name[:200]!r} in session {session}")
        return path

    def read_work_file(session: str, name: str) -> bytes:
        """A file the session's code wrote in its working directory. The kernel owns that directory, so
        the server opens it without following links and only as a plain file (no planted symlinks)."""
        try:
            s = sessions.get(session, owner=current_principal())
        except KernelexecError as exc:
            raise ResourceNotFoundError(str(exc)) from exc
        if "/" in name or name in ("", ".", ".."):
            raise ResourceNotFoundError(f"no file {name!r} in the working directory of session {session}")
        try:
            fd = os.open(s.dirs.work / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise ResourceNotFoundError(f"no file {name!r} in the working directory of session {session}") from exc
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ResourceNotFoundError(f"{name!r} is not a regular file")
            return read_capped(fh, name)

    @mcp.resource("kernelexec://sessions/{session}/work/{name}", name="session-work-file",
                  description="A file the session's code wrote in its working directory")
    def read_session_work_file(session: str, name: str) -> str | bytes:
        data = read_work_file(session, name)
        if name.rsplit(".", 1)[-1] in WORK_TEXT:
            return data.decode(errors="replace")
        return data

    @mcp.resource("kernelexec://sessions/{session}/files/{name}", name="session-file", description="A file a session produced (plots, spilled output)")
    def read_session_file(session: str, name: str) -> str | bytes:
        """Capped like a working-directory file: a cell can make a spilled stream as big as it likes (70 MiB of stdout
        in a second), and eight reads of one held every other session's calls for 5 s while their answers were
        encoded; the file stays on the server's disk, at the path its answer gave."""
        path = session_file(session, name)
        with path.open("rb") as fh:
            data = read_capped(fh, name)
        if path.suffix.lstrip(".") in TEXT_EXTENSIONS:
            return data.decode(errors="replace")
        return data

    @mcp.resource("kernelexec://sessions/{session}/notebook.ipynb", name="session-notebook",
                  mime_type="application/x-ipynb+json", description="The session's notebook record")
    async def read_notebook(session: str) -> str:
        try:
            s = await sessions.lookup(session, owner=current_principal())  # also one from before a server restart
        except KernelexecError as exc:
            raise ResourceNotFoundError(str(exc)) from exc
        path = await anyio.to_thread.run_sync(s.recorder.current)
        return await anyio.to_thread.run_sync(path.read_text)

    def visible_sessions(request: Any) -> list[Session]:
        headers = getattr(request, "headers", None)
        if headers is None:
            return [s for s in sessions.sessions.values() if not s.closed]
        handle = sessions.aliases.get(headers.get("mcp-session-id") or "")
        live = sessions.sessions.get(handle) if handle else None
        return [live] if live is not None and not live.closed else []

    async def list_session_resources(ctx: Any, call_next: Any) -> Any:
        result = await call_next(ctx)
        if ctx.method != "resources/list" or not isinstance(result, dict):
            return result
        visible = [(s.handle, s.dirs.outputs, s.dirs.work) for s in visible_sessions(ctx.request)]
        if not listing_threads:
            listing_threads.append(CapacityLimiter(2))
        extra = await to_thread.run_sync(listing, visible, limiter=listing_threads[0]) if visible else []
        return {**result, "resources": [*result.get("resources", []), *extra]}

    mcp.middleware.append(list_session_resources)
