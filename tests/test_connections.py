"""Published connection files: what ``kernelexec lab`` reads, and how entries of dead kernels go away."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from kernelexec.session import connections


def connection_file(session: Path) -> Path:
    session.mkdir(parents=True)
    path = session / "kernel.json"
    path.write_text(json.dumps({"transport": "ipc", "ip": str(session / "k"), "hb_port": 5, "key": "x", "kernel_name": "kernelexec"}))
    return path


def test_publish_links_the_session_kernel_file_and_withdraw_removes_it(tmp_path: Path) -> None:
    target = connection_file(tmp_path / "sessions" / "handle-1")
    connections.publish(tmp_path, "handle-1", target)
    entry = connections.connections_dir(tmp_path) / "handle-1.json"
    assert entry.is_symlink() and entry.resolve() == target.resolve()
    assert connections.live(connections.connections_dir(tmp_path)) == {"handle-1": entry}
    connections.withdraw(tmp_path, "handle-1")
    assert not entry.exists() and target.exists()


def test_a_kernel_in_the_other_slot_is_published_under_a_new_name(tmp_path: Path) -> None:
    """Jupyter keeps connection info per entry name: a warm spare's new ports and key need a new entry."""
    first = connection_file(tmp_path / "sessions" / "handle-2")
    spare = first.with_name("kernel-s.json")
    spare.write_text(first.read_text())
    directory = connections.connections_dir(tmp_path)
    connections.publish(tmp_path, "handle-2", first)
    connections.publish(tmp_path, "handle-2", spare)
    assert sorted(p.name for p in directory.iterdir()) == ["handle-2.s.json"]
    assert connections.live(directory) == {"handle-2": directory / "handle-2.s.json"}
    connections.publish(tmp_path, "handle-2", first)
    assert sorted(p.name for p in directory.iterdir()) == ["handle-2.json"]
    connections.withdraw(tmp_path, "handle-2")
    assert list(directory.iterdir()) == []


def test_prune_drops_a_dead_kernel_after_repeated_checks_and_keeps_a_live_one(tmp_path: Path) -> None:
    live = connection_file(tmp_path / "s" / "live")
    dead = connection_file(tmp_path / "s" / "dead")
    gone = connection_file(tmp_path / "s" / "gone")
    for handle, path in (("live", live), ("dead", dead), ("gone", gone)):
        connections.publish(tmp_path, handle, path)
    gone.unlink()  # the link dangles: a spare took over and the new entry is not published yet, or the server is gone
    directory = connections.connections_dir(tmp_path)
    assert sorted(connections.live(directory)) == ["dead", "gone", "live"]  # Lab keeps a session between two kernels
    strikes: dict[str, int] = {}
    with socket.socket(socket.AF_UNIX) as heartbeat:
        heartbeat.bind(str(tmp_path / "s" / "live" / "k-5"))
        heartbeat.listen()
        assert connections.kernel_answers(live) and not connections.kernel_answers(dead)
        for _ in range(9):  # a kernel restarting, or being replaced, is unreachable for seconds under load
            assert connections.prune(directory, strikes) == []
        assert sorted(connections.prune(directory, strikes)) == ["dead", "gone"]
    assert sorted(connections.live(directory)) == ["live"]


def test_a_takeover_keeps_the_session_in_lab_and_then_shows_its_new_kernel(tmp_path: Path) -> None:
    """The old kernel's files go before the new entry is published: Lab must see one session throughout."""
    first = connection_file(tmp_path / "sessions" / "h")
    directory = connections.connections_dir(tmp_path)
    connections.publish(tmp_path, "h", first)
    spare = first.with_name("kernel-s.json")
    spare.write_text(first.read_text())
    first.unlink()  # the replaced kernel cleaned up
    assert connections.live(directory) == {"h": directory / "h.json"}
    assert connections.prune(directory, {}, limit=2) == []
    connections.publish(tmp_path, "h", spare)
    assert connections.live(directory) == {"h": directory / "h.s.json"}
