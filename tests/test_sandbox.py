"""The OS layers: what each profile gets on this machine, that allowed work still works inside
them, and that strict/standard refuse to start without a boundary. Escape attempts live in
test_redteam.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernelexec.config import load_settings
from kernelexec.doctor import preflight
from kernelexec.errors import SandboxUnavailable
from kernelexec.sandbox.plan import plan_for
from kernelexec.sandbox.probe import probe

from .conftest import Harness, clean_env, kernelexec_cmd, make_settings, serving

pytestmark = [pytest.mark.anyio, pytest.mark.kernels_as_shipped]


def require_full_machine() -> None:
    f = probe()
    missing = [name for name, ok in (("Landlock", f.landlock_abi), ("seccomp", f.seccomp), ("bubblewrap", f.bwrap)) if not ok]
    if missing:
        pytest.fail(f"this test needs {', '.join(missing)} (CI installs bubblewrap; see .ci/run)")


@pytest.fixture(scope="module")
def data_dir(short_tmp: Path) -> Path:
    d = short_tmp / "granted"
    d.mkdir(exist_ok=True)
    (d / "table.csv").write_text("x,y\n1,2\n3,4\n")
    return d


@pytest.fixture(scope="module")
async def boxed(short_tmp: Path, data_dir: Path) -> AsyncIterator[Harness]:
    async with serving(make_settings(short_tmp, read_dirs=[data_dir])) as h:
        yield h


async def test_every_answer_states_the_layers_in_force(boxed: Harness) -> None:
    require_full_machine()
    r = await boxed.run("1")
    for layer in ("env", "rlimits", "seccomp", "bubblewrap", "netns", "guard"):
        assert layer in r["layers"], r["layers"]
    assert any(layer.startswith("landlock") for layer in r["layers"])
    session = await boxed.new_session()  # a session's first answer says so in its header too
    assert "layers=" in (await boxed.client.call_tool("execute_code", {"code": "2", "session": session})).content[0].text


async def test_data_science_works_inside_the_sandbox(boxed: Harness, data_dir: Path) -> None:
    r = await boxed.run(
        "import numpy as np, pandas as pd\n"
        f"df = pd.read_csv({str(data_dir / 'table.csv')!r})\n"
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(); ax.bar(df.x, df.y); plt.show()\n"
        "result = float(np.asarray(df.y).sum())"
    )
    assert r["success"], r["error"]
    assert r["result"] == 6.0
    assert sorted(o["mime_type"] for o in r["outputs"]) == ["image/png"]


async def test_granted_data_is_read_only(boxed: Harness, data_dir: Path) -> None:
    r = await boxed.run(f"open({str(data_dir / 'new.txt')!r}, 'w')")
    assert r["success"] is False
    assert not (data_dir / "new.txt").exists()


async def test_tempfiles_and_the_working_directory_are_writable(boxed: Harness) -> None:
    r = await boxed.run(
        "import tempfile, os\n"
        "with tempfile.TemporaryDirectory() as d:\n"
        "    open(os.path.join(d, 'a'), 'w').write('x')\n"
        "open('kept.txt', 'w').write('hello')\n"
        "result = sorted(os.listdir('.'))"
    )
    assert r["success"], r["error"]
    assert "kept.txt" in r["result"]
    session_dir = Path(r["notebook"]).parent
    assert (session_dir / "work" / "kept.txt").read_text() == "hello"


async def test_interrupts_reach_the_cell_through_bubblewrap(boxed: Harness) -> None:
    require_full_machine()
    s = await boxed.new_session()
    await boxed.run("alive = True", session=s)
    for code in ("while True: pass", "import time\ntime.sleep(100)", "import re\nre.match(r'(a+)+$', 'a' * 40 + 'b')"):
        r = await boxed.run(code, session=s, timeout=1)
        assert r["ending"] == "interrupted", (code, r)
    assert (await boxed.run("alive", session=s))["result"] is True


async def test_the_kernel_runs_without_capabilities_and_with_no_new_privs(boxed: Harness) -> None:
    require_full_machine()
    r = await boxed.run("result = open('/proc/self/status').read()")
    # the guard refuses /proc reads in standard; ask the trusted way instead below if it does
    if not r["success"]:
        settings = make_settings(boxed.settings.state_dir.parent, profile="trusted")
        async with serving(settings) as h:
            r = await h.run("result = open('/proc/self/status').read()")
    status = dict(line.split(":\t", 1) for line in r["result"].splitlines() if ":\t" in line)
    assert status["CapEff"].strip() == "0000000000000000"
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"


def test_standard_refuses_to_start_without_landlock_or_bubblewrap(short_tmp: Path) -> None:
    settings = load_settings(state_dir=short_tmp / "deg", disable_layers=["landlock", "bubblewrap"])
    with pytest.raises(SandboxUnavailable, match="--allow-degraded"):
        preflight(settings)
    proc = subprocess.run(
        kernelexec_cmd("exec", "--state-dir", str(short_tmp / "deg"), "--disable-layers", "landlock,bubblewrap", "1"),
        capture_output=True, text=True, env=clean_env(), timeout=60,
    )
    assert proc.returncode != 0 and "needs Landlock or bubblewrap" in proc.stderr


def test_degraded_mode_is_loud_and_visible_in_every_answer(short_tmp: Path) -> None:
    proc = subprocess.run(
        kernelexec_cmd("exec", "--state-dir", str(short_tmp / "deg2"), "--disable-layers", "landlock,bubblewrap",
                       "--allow-degraded", "1 + 1"),
        capture_output=True, text=True, env=clean_env(), timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "DEGRADED" in proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["result"] == 2
    assert "bubblewrap" not in answer["layers"] and not any(x.startswith("landlock") for x in answer["layers"])


def test_trusted_keeps_the_process_boundary_and_filesystem_view(short_tmp: Path) -> None:
    require_full_machine()
    settings = load_settings(state_dir=short_tmp / "t", profile="trusted")
    plan = plan_for(settings, "trusted", session_dir=short_tmp / "t" / "s", rw=[], ro=[], cwd=short_tmp, key="x")
    assert "guard" not in plan.layers
    assert "bubblewrap" in plan.layers and any(x.startswith("landlock") for x in plan.layers)
    assert plan.wrapper["seccomp"]["deny_fork"] is False  # subprocesses allowed


def test_doctor_prints_machine_layers_and_profiles() -> None:
    proc = subprocess.run(kernelexec_cmd("doctor"), capture_output=True, text=True, env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    for word in ("Landlock", "seccomp", "bubblewrap", "strict", "standard", "trusted", "status:"):
        assert word in proc.stdout


async def test_as_root_each_kernel_runs_under_its_own_unprivileged_uid(boxed: Harness) -> None:
    """Judged from what the test knows of the machine, not from the product's own probe (which would let a
    broken probe turn the layer off and the test accept it): root with bubblewrap on PATH means every kernel
    runs under its own uid."""
    a, b = await boxed.new_session(), await boxed.new_session()
    ra = await boxed.run("import os\nopen('mine.txt', 'w').close()\nresult = [os.getuid(), os.stat('mine.txt').st_uid]", session=a)
    rb = await boxed.run("import os\nresult = os.getuid()", session=b)
    if os.geteuid() == 0 and shutil.which("bwrap"):
        uid_a, owner = ra["result"]
        assert uid_a != 0 and owner == uid_a and rb["result"] not in (0, uid_a), (
            f"root with bubblewrap, yet no per-kernel uid ({ra['result']}, {rb['result']}; layers {ra['layers']}): "
            "is the interpreter world-readable? (a 0700 venv or prefix turns the layer off; CI's must not be)")
        assert f"uid-{uid_a}" in ra["layers"]
        # and its files belong to it, not to root: another session's uid cannot open them
        assert (Path(ra["notebook"]).parent / "work" / "mine.txt").stat().st_uid == uid_a
    else:  # the fallback is stated, not silent
        assert ra["result"][0] == os.getuid() and not any(x.startswith("uid-") for x in ra["layers"])


def test_the_hand_over_walk_follows_no_symlink_and_opens_no_fifo(tmp_path: Path) -> None:
    """The directories are handed to a kernel's uid as root; a tree planted (and changing) under them
    must not redirect a chown outside or block the server on a FIFO."""
    import threading

    from kernelexec.sandbox.plan import _chown_tree

    if os.geteuid() != 0:
        pytest.fail("chown to another uid needs root (CI runs as root)")
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "file").write_text("host")
    os.mkfifo(outside / "fifo")
    top = tmp_path / "work"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_text("mine")
    (top / "to_outside").symlink_to(outside)
    (top / "to_fifo").symlink_to(outside / "fifo")
    os.mkfifo(top / "own_fifo")
    stop = threading.Event()

    def swap() -> None:  # a directory that keeps becoming a symlink to the FIFO or to the outside dir
        while not stop.is_set():
            for target in (outside / "fifo", outside):
                try:
                    (top / "s" / "x").mkdir(parents=True)
                    (top / "s" / "x").rmdir()
                    (top / "s").rmdir()
                    (top / "s").symlink_to(target)
                    (top / "s").unlink()
                except OSError:
                    pass

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        for _ in range(200):
            _chown_tree(str(top), 54321)
    finally:
        stop.set()
        swapper.join()
    assert (top / "a" / "b" / "f").stat().st_uid == 54321 and top.stat().st_uid == 54321
    assert (top / "to_outside").lstat().st_uid == 54321  # the link itself
    for path in (outside, outside / "dir", outside / "file", outside / "fifo"):
        assert path.lstat().st_uid == 0, path


async def test_shell_commands_run_where_processes_are_allowed_and_are_refused_in_the_guards_words(
        boxed: Harness, short_tmp: Path) -> None:
    """`!cmd` opens a pty first: trusted gets its own devpts (bubblewrap), standard the guard's refusal, never
    "out of pty devices"."""
    require_full_machine()
    refused = await boxed.run("!echo from-the-shell")
    assert not refused["success"] and "running shell commands" in refused["error"] and "pty" not in refused["error"], refused
    async with serving(make_settings(short_tmp, profile="trusted", pool_size=0, restart_spares=0)) as trusted:
        ran = await trusted.run("!echo from-the-shell\nlines = !ls /dev/pts\nresult = sorted(lines)[:3]")
        assert ran["success"] and "from-the-shell" in ran["stdout"], ran
        assert "ptmx" in ran["result"], ran  # the sandbox's own devpts instance, not the host's terminals
