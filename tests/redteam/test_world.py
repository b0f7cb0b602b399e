"""The red team's own oracle, checked without kernels: which processes count as a session's kernel, and one world on
the machine at a time."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .world import WORLD_LOCK, World, kernel_script_index

K = b"/x/startup/kernel_main.py"


@pytest.mark.parametrize("argv", [
    [b"/usr/bin/python3", K, b"-f", b"c.json"],
    [b"/v/bin/python", b"-s", b"-S", K, b"-f", b"c.json"],
    [b"/v/bin/python3.12", b"-I", b"-X", b"dev", b"-W", b"error", b"-sS", K, b"-f", b"c.json"],
])
def test_a_kernel_is_found_whatever_interpreter_flags_precede_its_script(argv: list[bytes]) -> None:
    assert argv[kernel_script_index(argv)] == K


@pytest.mark.parametrize("argv", [
    [b"bwrap", b"--die-with-parent", b"--", b"/v/bin/python", b"-s", b"-S", K, b"-f", b"c.json"],
    [b"/v/bin/python", b"-S", b"/x/startup/sandbox_exec.py", b"--", b"/v/bin/python", b"-s", b"-S", K],
    [b"/bin/sh", b"-c", b"exec /v/bin/python -s -S /x/startup/kernel_main.py"],
    [b"/v/bin/python", b"-c", b"import x", K],
    [b"/v/bin/python", b"-m", b"pytest", K],
    [],
])
def test_the_wrappers_carrying_a_kernel_command_line_are_not_kernels(argv: list[bytes]) -> None:
    assert kernel_script_index(argv) is None


def test_while_a_world_exists_another_process_cannot_make_one(world: World) -> None:
    """The package's world holds the machine's world lock: another pytest process's world would wait (a run beside
    this one, .ci/run's weakened red team, must not bind the DNS canary or change the host under these judges)."""
    probe = ("import fcntl, sys\nwith open(sys.argv[1], 'a') as f:\n"
             "    try:\n        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    except BlockingIOError:\n"
             "        sys.exit(3)\n")
    assert subprocess.run([sys.executable, "-c", probe, str(WORLD_LOCK)], timeout=30).returncode == 3
