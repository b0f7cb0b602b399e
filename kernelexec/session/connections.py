"""Where other processes find the live session kernels: ``<state dir>/connections/<handle>.json``.

Each entry is a relative symlink to the session's own ``kernel.json``, made when its kernel starts
and removed when it stops. ``kernelexec lab`` (a separate process) points Jupyter Server's
``external_connection_dir`` at this directory. A server killed with SIGKILL leaves its entries
behind; ``prune`` (run by ``kernelexec lab``) drops those whose kernel no longer answers. Stdlib only: the server imports this.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

logger = logging.getLogger(__name__)


def connections_dir(state_dir: Path) -> Path:
    return state_dir / "connections"


def entry_name(handle: str, connection_file: Path) -> str:
    """``<handle>.json`` for a session's first kernel slot (``kernel.json``), ``<handle>.<slot>.json`` for
    the other (``kernel-<slot>.json``, a warm spare that took over). Jupyter Server keeps an external
    kernel's connection info per entry *name*, so a kernel with new ports and key needs a new name."""
    stem = connection_file.stem
    return f"{handle}.json" if stem == "kernel" else f"{handle}.{stem.removeprefix('kernel-')}.json"


def publish(state_dir: Path, handle: str, connection_file: Path) -> None:
    """Expose a session's running kernel (and no other of its kernels). Called when a kernel of the
    session starts or takes over."""
    directory = connections_dir(state_dir)
    name = entry_name(handle, connection_file)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = directory / f".{handle}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(os.path.relpath(connection_file, directory))
        os.replace(tmp, directory / name)
        for old in _entries(directory, handle):
            if old.name != name:
                old.unlink(missing_ok=True)
    except OSError:  # inspection is a convenience: never fail a session over it
        logger.exception("could not publish the connection file of %s", handle)


def _entries(directory: Path, handle: str) -> list[Path]:
    return [directory / f"{handle}.json", *directory.glob(f"{handle}.*.json")]


def withdraw(state_dir: Path, handle: str) -> None:
    """Stop exposing a session's kernel. Called when the session's kernel is shut down."""
    try:
        for entry in _entries(connections_dir(state_dir), handle):
            entry.unlink(missing_ok=True)
    except OSError:
        logger.exception("could not withdraw the connection file of %s", handle)


def kernel_answers(connection_file: Path, timeout: float = 0.5) -> bool:
    """True when something listens on the kernel's heartbeat endpoint (ipc or tcp)."""
    try:
        info = json.loads(connection_file.read_text())
        port = int(info["hb_port"])
        if info.get("transport", "tcp") == "ipc":
            address: str | tuple[str, int] = f"{info['ip']}-{port}"
            family = socket.AF_UNIX
        else:
            address, family = (info.get("ip") or "127.0.0.1", port), socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(address)
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def prune(directory: Path, strikes: dict[str, int], limit: int = 10) -> list[str]:
    """Remove entries whose kernel failed ``limit`` checks in a row; return their handles.

    Called about once a second by ``kernelexec lab``, for entries their server left behind (it was killed: a
    server withdraws its own). One failed check is not enough: a kernel restarting in place is unreachable for
    as long as its start takes (seconds, under load), and a warm spare's takeover leaves the old entry's link
    dangling until the server publishes the new one. An entry pruned then would never come back (the server
    publishes a kernel once), and Lab would lose the session.
    """
    removed: list[str] = []
    try:
        entries = [p for p in directory.iterdir() if p.suffix == ".json"]
    except OSError:
        return removed
    for entry in entries:
        if kernel_answers(entry):
            strikes.pop(entry.stem, None)
            continue
        strikes[entry.stem] = strikes.get(entry.stem, 0) + 1
        if strikes[entry.stem] >= limit:
            entry.unlink(missing_ok=True)
            strikes.pop(entry.stem, None)
            removed.append(entry.stem)
    return removed


def live(directory: Path) -> dict[str, Path]:
    """Handle → connection file of every published kernel (not checked for liveness). A dangling entry counts: its
    session is between two kernels (a spare's takeover), not gone."""
    try:
        return {p.stem.split(".")[0]: p for p in sorted(directory.iterdir())
                if p.suffix == ".json" and (p.is_file() or p.is_symlink())}
    except OSError:
        return {}


# --- restart requests from `kernelexec lab` -------------------------------------------------------------
RESTART_SUFFIX = ".restart"


def request_restart(directory: Path, handle: str) -> None:
    """Ask the server holding ``handle`` to restart its kernel (JupyterLab's "Restart Kernel"). The
    server's housekeeping takes the request (``take_restart_request``) and restarts through the session,
    so the notebook record and the agent's next answer say so."""
    path = directory / f"{handle}{RESTART_SUFFIX}"
    tmp = directory / f".{handle}{RESTART_SUFFIX}.tmp"
    tmp.write_text("")
    os.replace(tmp, path)


def take_restart_request(directory: Path, handle: str) -> bool:
    """True (and the request gone) when ``kernelexec lab`` asked to restart ``handle``'s kernel."""
    try:
        (directory / f"{handle}{RESTART_SUFFIX}").unlink()
    except OSError:
        return False
    return True


def cancel_restart_request(directory: Path, handle: str) -> None:
    (directory / f"{handle}{RESTART_SUFFIX}").unlink(missing_ok=True)


def restart_done(directory: Path, handle: str, outcome: str) -> None:
    """The server's answer to a restart request: "ok" or what went wrong."""
    tmp = directory / f".{handle}{RESTART_SUFFIX}d.tmp"
    tmp.write_text(outcome[:2000])
    os.replace(tmp, directory / f"{handle}{RESTART_SUFFIX}d")


def take_restart_done(directory: Path, handle: str) -> str | None:
    """The server's answer to this handle's restart request, once there (and then gone)."""
    path = directory / f"{handle}{RESTART_SUFFIX}d"
    try:
        outcome = path.read_text()
    except OSError:
        return None
    path.unlink(missing_ok=True)
    return outcome
