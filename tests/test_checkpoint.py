"""State that outlives its kernel (issue 32): checkpoints written inside the kernel, restored inside the
next one after any death, and only the cells that made what could not be saved run again.

Real kernels behind the real MCP server; every death is a real one (SIGKILL from outside, ``os._exit``
in a cell, a timeout's restart)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernelexec.backends.local import LocalKernel

from .support import Harness, make_settings, serving

pytestmark = pytest.mark.anyio


async def settled(h: Harness, s: str) -> dict[str, Any]:
    """Wait for the background save of the last cell (the next cell would wait for it too)."""
    status = (await h.run("_kernelexec_checkpoint_status()._repr_json_()", session=s))["result"]
    return status  # type: ignore[no-any-return]


def pid_of(h: Harness, s: str) -> int:
    kernel = h.sessions.sessions[s].kernel
    assert kernel is not None and kernel.km is not None
    return int(kernel.km.provisioner.process.pid)  # type: ignore[union-attr]


async def test_sigkill_then_the_next_call_finds_the_variables(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("import math\nx = 41\ndata = {'a': [1, 2, 3]}\nclass P:\n    pass\n", session=s)
    await harness.run("data['a'].append(4)\nx += 1", session=s)  # an in-place change: saved too
    status = await settled(harness, s)
    assert {"x", "data", "math"} <= set(status["saved"]), status
    assert "P" in status["unsaved"]
    os.kill(pid_of(harness, s), signal.SIGKILL)
    await anyio.sleep(0.5)
    r = await harness.run("result = (x, data, math.pi > 3, P.__name__)", session=s)
    assert r["result"] == [42, {"a": [1, 2, 3, 4]}, True, "P"], r
    restored = r["restored"]
    assert {"x", "data", "math"} <= set(restored["restored"]), restored
    assert [c["cell"] for c in restored["reran"]] == [1] and restored["reran"][0]["for_names"] == ["P"], restored
    assert "restored" in (r["restart_reason"] or "") and "re-ran cell 1 for P" in r["restart_reason"], r


async def test_os_exit_in_a_cell(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("big = list(range(100_000))\ny = 'kept'", session=s)
    await settled(harness, s)
    dead = await harness.client.call_tool("execute_code", {"code": "import os\nos._exit(3)", "session": s})
    assert dead.structured_content["ending"] == "kernel_died"
    r = await harness.run("result = (len(big), y)", session=s)
    assert r["result"] == [100_000, "kept"], r
    assert r["restored"]["reran"] == [], r["restored"]
    # twice: the new kernel's own saves never remove what its manifest names (it once did, by reusing a file name)
    await harness.run("big.append(1)", session=s)
    await settled(harness, s)
    await harness.client.call_tool("execute_code", {"code": "import os\nos._exit(3)", "session": s})
    r = await harness.run("result = (len(big), y)", session=s)
    assert r["result"] == [100_001, "kept"] and r["restored"]["reran"] == [], r["restored"]


async def test_timeout_restart_then_restore(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp, interrupt_grace=1.0)) as h:
        s = await h.new_session()
        await h.run("z = [1, 2]", session=s)
        await settled(h, s)
        stuck = await h.client.call_tool("execute_code", {"code": "import time, signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                                                   "time.sleep(60)", "session": s, "timeout": 2})
        assert stuck.structured_content["ending"] == "restarted", stuck.structured_content
        r = await h.run("result = z", session=s)
        assert r["result"] == [1, 2], r


async def test_only_the_cell_that_made_an_unpicklable_object_runs_again(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("counter = 0\nseed = [5, 6, 7]", session=s)  # cell 1
    await harness.run("counter += 1\ngen = (v * 2 for v in seed)\nruns_of_cell_2 = counter", session=s)  # cell 2
    await harness.run("other = sum(seed)\ncounter += 10", session=s)  # cell 3
    await harness.run("fh = open('notes.txt', 'w')", session=s)  # cell 4
    status = await settled(harness, s)
    assert {"gen", "fh"} <= set(status["unsaved"]), status
    os.kill(pid_of(harness, s), signal.SIGKILL)
    await anyio.sleep(0.5)
    r = await harness.run("result = (next(gen), other, counter, fh.closed)", session=s)
    reran = {c["cell"]: c["for_names"] for c in r["restored"]["reran"]}
    assert reran == {2: ["gen"], 4: ["fh"]}, r["restored"]
    # cell 2 ran again (gen is back) but counter keeps the checkpoint's value, not cell 2's rerun of it
    assert r["result"] == [10, 18, 11, False], r
    assert "re-ran cell 2 for gen" in r["restart_reason"]


async def test_lost_when_no_cell_can_make_it_again(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("import threading\nglobals()['ghost'] = threading.Lock()\nkeep = 1", session=s)
    status = await settled(harness, s)
    assert "ghost" in status["unsaved"]  # no recorded cell binds it by name
    os.kill(pid_of(harness, s), signal.SIGKILL)
    await anyio.sleep(0.5)
    r = await harness.run("result = keep", session=s)
    assert r["result"] == 1
    assert r["restored"]["lost"] == ["ghost"] and "lost: ghost" in r["restart_reason"], r["restored"]


async def test_over_the_cap_names_what_it_left_out(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp, checkpoint_mb=1)) as h:
        s = await h.new_session()
        await h.run("small = 'x' * 1000\nhuge = b'y' * 3_000_000", session=s)
        status = await settled(h, s)
        assert "small" in status["saved"]
        assert "huge" in status["unsaved"] and "cap" in status["unsaved"]["huge"], status
        assert status["bytes"] <= 1_000_000


async def test_plain_restart_drops_the_checkpoint_restore_brings_it_back(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("kept = 7", session=s)
    await settled(harness, s)
    info = await harness.call("restart_session", session=s, restore=True)
    assert info.structured_content["restored"]["restored"] == ["kept"], info.structured_content
    assert (await harness.run("result = kept", session=s))["result"] == 7
    await harness.call("restart_session", session=s)
    r = await harness.client.call_tool("execute_code", {"code": "kept", "session": s})
    assert r.structured_content["error_type"] == "NameError"


async def test_x_equals_1_writes_nothing_when_nothing_changed(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("x = 1", session=s)
    await settled(harness, s)
    manifest = harness.settings.sessions_dir / s / "checkpoint" / "manifest.json"
    before = manifest.stat().st_mtime_ns
    time.sleep(0.05)
    await harness.run("print('hello')", session=s)
    await settled(harness, s)
    assert manifest.stat().st_mtime_ns == before


async def test_only_user_names_are_saved_and_a_key_that_is_no_name_stops_nothing(harness: Harness) -> None:
    """The scan of a cell's names leaves out IPython's (``_i<n>``, ``_<n>``, ``In``), private ones and keys that
    are no identifier, and keeps going past a key that is no string at all (it used to stop every later save)."""
    s = await harness.new_session()
    await harness.run("globals()[1] = 'an int key'\nglobals()['no name'] = 2\n_private = 3\nkept = 4\n5", session=s)
    await harness.run("In = 'rebound'\nlater = kept + 1", session=s)
    status = await settled(harness, s)
    assert status["error"] is None, status
    assert {"kept", "later"} <= set(status["saved"]), status
    named = set(status["saved"]) | set(status["unsaved"])
    assert not {n for n in named if n.startswith("_") or not n.isidentifier() or n == "In"}, status


SLOW = """
import time
class Slow:
    def __init__(self):
        self.n = 1
    def __reduce__(self):  # runs in the saver thread: reads n, dawdles, reads n again
        first = self.n
        time.sleep(SECONDS)
        return (tuple, ((first, self.n),))
s = Slow()
"""


async def test_the_next_cell_never_waits_for_a_save(harness: Harness) -> None:
    """A save taking 4 s (a slow ``__reduce__``) runs after the answer and never holds the next cell up."""
    s = await harness.new_session()
    t0 = time.perf_counter()
    await harness.run(SLOW.replace("SECONDS", "4"), session=s)
    await harness.run("y = 2", session=s)
    await harness.run("z = 3", session=s)
    assert time.perf_counter() - t0 < 3.0, "a cell waited for the previous cell's save"
    status = await settled(harness, s)  # the server's status call does wait: every change saved by then
    assert {"s", "y", "z"} <= set(status["saved"]) and status["superseded"] >= 1, status
    await harness.call("close_session", session=s)  # the module's server has room for 16


async def test_a_save_a_cell_interrupts_is_dropped_and_done_again_never_torn(harness: Harness) -> None:
    """The next cell changes ``s`` in place while its save reads it: that save is dropped (the file could mix the
    values before and after), and ``s`` is saved again after the cell, as it then is. A death afterwards finds
    the consistent (2, 2), never the torn (1, 2)."""
    s = await harness.new_session()
    await harness.run(SLOW.replace("SECONDS", "1.5"), session=s)
    await anyio.sleep(0.3)  # the save has read n == 1 and dawdles
    await harness.run("s.n = 2", session=s)
    status = await settled(harness, s)
    assert "s" in status["saved"] and status["superseded"] >= 1, status
    await harness.client.call_tool("execute_code", {"code": "import os\nos._exit(1)", "session": s})
    r = await harness.run("result = s", session=s, timeout=60)
    assert r["result"] == [2, 2], r
    await harness.call("close_session", session=s)


async def test_a_death_before_a_save_is_done_recomputes_never_loads_the_older_value(harness: Harness) -> None:
    """While a changed name waits for its save, the manifest names it unsaved: a death then reruns its cells
    instead of loading the value from before the change."""
    s = await harness.new_session()
    await harness.run("v = 1", session=s)
    await settled(harness, s)
    await harness.run(SLOW.replace("SECONDS", "30") + "v = 2", session=s)
    await anyio.sleep(0.5)  # the save of s (and v) is under way; v = 2 is not on disk yet
    os.kill(pid_of(harness, s), signal.SIGKILL)
    await anyio.sleep(0.5)
    r = await harness.run("result = v", session=s, timeout=60)
    assert r["result"] == 2, r
    await harness.call("close_session", session=s)


async def test_a_name_a_later_cell_rebinds_while_the_saver_is_busy_is_never_loaded_with_its_older_value(harness: Harness) -> None:
    """A saved name rebound by a cell while the saver is still busy with an earlier cell's names: the manifest names it
    unsaved before that cell's answer leaves, so a death then reruns the cell instead of loading the older value. (Before,
    the name kept its old file in the manifest until the saver got to it: seconds here, for as long as cells keep
    coming after a save they interrupt.) A name deleted meanwhile is not brought back either."""
    s = await harness.new_session()
    await harness.run("v = 1\nw = 1", session=s)
    await settled(harness, s)
    began = harness.sessions.sessions[s].dirs.work / "reduce-began"
    slow = SLOW.replace("SECONDS", "30").replace("        first = self.n\n", "        first = self.n\n        open('reduce-began', 'w').close()\n")
    assert slow.count("reduce-began") == 1
    await harness.run(slow, session=s)  # the saver dawdles in s's __reduce__
    with anyio.fail_after(30):
        while not began.exists():  # the save of s is under way
            await anyio.sleep(0.05)
    await harness.run("v = 2\ndel w", session=s)
    os.kill(pid_of(harness, s), signal.SIGKILL)
    await anyio.sleep(0.5)
    r = await harness.run("result = (v, 'w' in globals())", session=s, timeout=60)
    assert r["result"] == [2, False], r
    await harness.call("close_session", session=s)


# --- fork ------------------------------------------------------------------------------------------------


@pytest.fixture(params=["copied", "relayed"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How a fork's checkpoint travels: local kernels' files copied on this host, or relayed through the kernels
    as a gateway's are (the same real local kernels, told their checkpoint is not the server's to reach)."""
    if request.param == "relayed":
        monkeypatch.setattr(LocalKernel, "checkpoint_on_this_host", False)
    return str(request.param)


@pytest.fixture
def relayed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LocalKernel, "checkpoint_on_this_host", False)


async def test_a_fork_has_the_variables_and_the_record_and_each_changes_alone(harness: Harness, transport: str) -> None:
    s = await harness.new_session()
    await harness.run("shared = [1, 2]\nsource = open('in.txt', 'w')", session=s)
    await harness.run("n = 5", session=s)
    forked = await harness.call("fork_session", session=s)
    info = forked.structured_content
    assert not forked.is_error, forked.content
    f = info["session"]
    assert f != s and info["forked_from"] == s and info["status"] == "forked"
    assert {"shared", "n"} <= set(info["restored"]["restored"]), info
    assert [c["cell"] for c in info["restored"]["reran"]] == [1], info  # the open file made again, in the fork's own dir
    await harness.run("shared.append('fork only')\nn = 6", session=f)
    await harness.run("shared.append('source only')", session=s)
    assert (await harness.run("result = (shared, n, source.name)", session=f))["result"] == [[1, 2, "fork only"], 6, "in.txt"]
    assert (await harness.run("result = (shared, n)", session=s))["result"] == [[1, 2, "source only"], 5]
    assert (harness.settings.sessions_dir / f / "work" / "in.txt").exists()
    nb = json.loads((harness.settings.sessions_dir / f / "notebook.ipynb").read_text())
    assert nb["metadata"]["kernelexec"]["forked_from"]["session"] == s
    assert [c["source"] for c in nb["cells"] if c["cell_type"] == "code"][:2] == [
        "shared = [1, 2]\nsource = open('in.txt', 'w')", "n = 5"]
    for done in (s, f):  # the module's server holds 16 sessions
        await harness.call("close_session", session=done)


# --- the host rule: a checkpoint is data its own kernel wrote --------------------------------------------

EVIL = """
import pickle, os
class Evil:
    def __init__(self, path):
        self.path = path
    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('ran')",))
inside = os.path.abspath('inside-marker')
outside = OUTSIDE
manifest = {"version": 1, "vars": {"evil_in": {"file": "evil_in.pkl", "bytes": 1},
                                   "evil_out": {"file": "evil_out.pkl", "bytes": 1}}, "unsaved": {}}
"""


async def test_a_forged_checkpoint_runs_only_inside_its_own_sandbox(harness: Harness) -> None:
    outside = harness.settings.state_dir / "outside-marker"
    s, other = await harness.new_session(), await harness.new_session()
    await harness.run("y = 1", session=other)
    await settled(harness, other)
    await harness.run(EVIL.replace("OUTSIDE", repr(str(outside))), session=s)
    await settled(harness, s)  # the kernel's save of this cell is done; now the forgery, as the cell's last word
    await harness.run("d = os.path.join(os.path.dirname(os.getcwd()), 'checkpoint')\n"
                      "open(os.path.join(d, 'evil_in.pkl'), 'wb').write(pickle.dumps(Evil(inside)))\n"
                      "open(os.path.join(d, 'evil_out.pkl'), 'wb').write(pickle.dumps(Evil(outside)))\n"
                      "open(os.path.join(d, 'manifest.json'), 'w').write(__import__('json').dumps(manifest))\n"
                      "_kernelexec_checkpoint_pause()",  # its own kernel writes nothing more over the forgery
                      session=s)
    # the other session dies and comes back: it loads its own checkpoint only
    os.kill(pid_of(harness, other), signal.SIGKILL)
    await anyio.sleep(0.5)
    r = await harness.run("result = y", session=other)
    assert r["result"] == 1 and r["restored"]["restored"] == ["y"]
    assert not (harness.settings.sessions_dir / other / "work" / "inside-marker").exists()
    # its own session: loaded inside its kernel, under its sandbox — the marker only where the cell could write
    os.kill(pid_of(harness, s), signal.SIGKILL)
    await anyio.sleep(0.5)
    r = await harness.run("result = 1", session=s)
    assert (harness.settings.sessions_dir / s / "work" / "inside-marker").read_text() == "ran"
    assert not outside.exists(), "a forged checkpoint wrote outside its session"
    assert "evil_out" in r["restored"]["why"] and "evil_out" in r["restored"]["lost"], r["restored"]
    assert "Error" in r["restored"]["why"]["evil_out"]  # reported (the guard or the OS refused it), never trusted


LIAR = """
import builtins
class J:
    def __init__(self, payload):
        self.payload = payload
    def _repr_json_(self):
        return self.payload
builtins._kernelexec_checkpoint_export = lambda: J({"files": FILES})
def liar(comm, opened):
    comm.on_msg(lambda msg: comm.send({"bytes": msg["content"]["data"].get("size")}, buffers=BUFFERS))
    comm.send({"ready": True})
get_ipython().kernel.comm_manager.register_target("kernelexec.checkpoint", liar)
"""


@pytest.mark.parametrize(("files", "buffers", "why"), [
    ([["../../escape.pkl", 4]], "[b'AAAA']", "not one kernelexec writes"),  # a path out of the fork's directory
    ([["manifest.json", 4]], "[b'AAA']", "not 4 bytes"),  # less than it says
    ([["manifest.json", 4]], "[b'A' * 400_000]", "not 4 bytes"),  # more than it announced
    ([["manifest.json", 4]], "[]", "not 4 bytes"),  # no bytes at all
    ([["manifest.json", 4]], "[b'AA', b'AA']", "not 4 bytes"),  # the right size, in two buffers
    ([["manifest.json", 2_000_000_000]], "[]", "larger than"),  # past the cap: refused before a byte moves
])
async def test_a_source_kernel_that_lies_to_its_fork_is_refused_by_the_relay(
        harness: Harness, relayed: None, files: list[Any], buffers: str, why: str) -> None:
    """The fork's relay is a new door: the source kernel's cell replaces the function that names its checkpoint and
    the comm target that reads it out. The server checks names, sizes and pieces before passing anything on, writes
    nothing of it itself."""
    s = await harness.new_session()
    await harness.run("mine = 1", session=s)
    await harness.run(LIAR.replace("FILES", json.dumps(files)).replace("BUFFERS", buffers), session=s)
    before = {p.name for p in harness.settings.sessions_dir.iterdir()}
    refused = await harness.call("fork_session", session=s)
    assert refused.is_error and why in refused.content[0].text, refused.content
    assert not (harness.settings.sessions_dir / "escape.pkl").exists()
    assert not list(harness.settings.sessions_dir.glob("*/escape.pkl"))
    for new in {p.name for p in harness.settings.sessions_dir.iterdir()} - before:
        assert not list((harness.settings.sessions_dir / new / "checkpoint").glob("manifest.json*"))
    await harness.call("close_session", session=s)


RECEIVE = """
import types
target = get_ipython().kernel.comm_manager.targets["kernelexec.checkpoint"]
class Comm:
    sent = []
    def on_msg(self, f):
        self.answer = f
    def send(self, data=None, buffers=None):
        self.sent.append(data)
comm = Comm()
target(comm, {})
comm.answer({"content": {"data": {"op": "write", "name": NAME, "offset": 0}}, "buffers": [b"AAAA"]})
result = comm.sent[-1]
"""


@pytest.mark.parametrize("name", ["../work/x", "/tmp/x", ".hidden"])
async def test_a_cell_cannot_write_outside_its_checkpoint_through_the_relay(harness: Harness, name: str) -> None:
    """The relay's comm target is reachable by a cell of a new session (it holds its kernel): a write is taken only
    under a plain name, in its own checkpoint directory."""
    s = await harness.new_session()
    r = await harness.run(RECEIVE.replace("NAME", repr(name)), session=s)
    assert "ValueError" in r["result"]["error"], r
    assert not (harness.settings.sessions_dir / s / "work" / "x.part").exists()
    assert not list(harness.settings.sessions_dir.glob(f"{s}/**/*.part"))
    await harness.call("close_session", session=s)


LIAR_SIZES = """
import builtins
class J:
    def __init__(self, payload):
        self.payload = payload
    def _repr_json_(self):
        return self.payload
builtins._kernelexec_checkpoint_export = lambda: J({"files": FILES})
"""


@pytest.mark.parametrize(("files", "why"), [
    ([["manifest.json", 4]], "not the 4 bytes its kernel announced"),  # less than the file: never a torn copy
    ([["manifest.json", 1]], "not the 1 bytes its kernel announced"),
    ([["manifest.json", 5], ["manifest.json", 5]], "named a checkpoint file twice"),
    ([["hole.1.1.pkl", 40 * 2**20]], "a sparse file"),  # 40 MiB of holes, under the cap: not filled on our disk
    ([["fifo.pkl", 0]], "not a regular file"),  # a FIFO: never opened for a blocking read
])
async def test_a_source_kernel_that_lies_to_its_fork_is_refused_by_the_direct_copy(
        harness: Harness, files: list[Any], why: str) -> None:
    """Local kernels' checkpoints are copied by the server: what the source kernel announces is checked against
    the files themselves before a byte is written, and nothing but the announced bytes of regular files moves."""
    s = await harness.new_session()
    await harness.run("mine = 1", session=s)
    await settled(harness, s)
    ckpt = harness.settings.sessions_dir / s / "checkpoint"
    with open(ckpt / "hole.1.1.pkl", "wb") as fh:  # as a kernel that got around its guard could
        fh.truncate(40 * 2**20)
    os.mkfifo(ckpt / "fifo.pkl")
    await harness.run(LIAR_SIZES.replace("FILES", json.dumps(files)), session=s)
    before = {p.name for p in harness.settings.sessions_dir.iterdir()}
    refused = await harness.call("fork_session", session=s)
    assert refused.is_error and why in refused.content[0].text, refused.content
    for new in {p.name for p in harness.settings.sessions_dir.iterdir()} - before:
        for copied in (harness.settings.sessions_dir / new / "checkpoint").glob("*"):
            assert not copied.name.startswith("manifest.json"), "a manifest was put in place"
            assert copied.stat().st_blocks * 512 < 2**20, "the holes were filled on the host"
    await harness.call("close_session", session=s)


async def test_a_checkpoint_file_that_is_a_symlink_is_refused_by_fork_and_by_restore(harness: Harness, transport: str) -> None:
    victim, s = await harness.new_session(), await harness.new_session()
    await harness.run("secret = 'victim'", session=victim)
    await settled(harness, victim)
    await harness.run("mine = 1", session=s)
    status = await settled(harness, s)
    assert status["saved"] == ["mine"]
    ckpt = harness.settings.sessions_dir / s / "checkpoint"
    victim_file = next((harness.settings.sessions_dir / victim / "checkpoint").glob("secret.*.pkl"))
    # as a kernel that got around its guard could: the manifest names a link to another session's pickle
    (ckpt / "secret.1.1.pkl").symlink_to(victim_file)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["vars"]["secret"] = {"file": "secret.1.1.pkl", "bytes": 10}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    refused = await harness.call("fork_session", session=s)
    assert refused.is_error and "not a regular file" in refused.content[0].text, refused.content
    info = await harness.call("restart_session", session=s, restore=True)
    restored = info.structured_content["restored"]
    assert restored["restored"] == ["mine"] and "secret" in restored["why"], restored
    r = await harness.client.call_tool("execute_code", {"code": "secret", "session": s})
    assert r.structured_content["error_type"] == "NameError"
    for done in (victim, s):  # the module's server holds 16 sessions
        await harness.call("close_session", session=done)


async def test_a_fork_copies_only_what_the_manifest_names_and_never_past_the_cap(short_tmp: Path) -> None:
    """A cell can leave a 250 MiB file that holds 4 KiB (os.truncate) in its checkpoint directory: a fork copies
    only what the manifest names, and a manifest naming more than the cap is refused before a byte moves."""
    async with serving(make_settings(short_tmp, checkpoint_mb=50)) as h:
        s = await h.new_session()
        await h.run("mine = 1", session=s)
        await settled(h, s)
        ckpt = h.settings.sessions_dir / s / "checkpoint"
        hole = ckpt / "hole.1.1.pkl"  # as a kernel that got around its guard could
        with open(hole, "wb") as fh:
            fh.truncate(250 * 2**20)
        forked = await h.call("fork_session", session=s)
        assert not forked.is_error, forked.content
        f = forked.structured_content["session"]
        assert not (h.settings.sessions_dir / f / "checkpoint" / hole.name).exists()
        assert (await h.run("result = mine", session=f))["result"] == 1
        manifest = json.loads((ckpt / "manifest.json").read_text())
        manifest["vars"]["hole"] = {"file": hole.name, "bytes": 1}
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
        before = {p.name for p in h.settings.sessions_dir.iterdir()}
        refused = await h.call("fork_session", session=s)
        assert refused.is_error and "larger than" in refused.content[0].text, refused.content
        for new in {p.name for p in h.settings.sessions_dir.iterdir()} - before:
            assert not list((h.settings.sessions_dir / new / "checkpoint").glob("hole*")), "a byte of it moved"


async def test_idle_reaping_then_the_next_call_finds_the_variables(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("kept = {'k': 1}", session=s)
    await settled(harness, s)
    session = harness.sessions.sessions[s]
    async with session.lock:
        await session.stop_kernel()  # what the idle reaper does
    r = await harness.run("result = kept", session=s)
    assert r["result"] == {"k": 1} and r["restored"]["restored"] == ["kept"], r


async def test_a_name_rebound_to_a_new_object_at_the_old_ones_address_is_saved(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("x = [1]", session=s)
    await harness.run("x = None\nx = [2]", session=s)  # the new list may reuse the freed one's id() if nothing held it
    await settled(harness, s)
    os.kill(pid_of(harness, s), signal.SIGKILL)
    await anyio.sleep(0.5)
    assert (await harness.run("result = x", session=s))["result"] == [2]


async def test_strict_profile_checkpoints_and_restores(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp, profile="strict")) as h:
        s = await h.new_session()
        await h.run("import collections\ncounts = collections.Counter('abca')", session=s)
        await settled(h, s)
        os.kill(pid_of(h, s), signal.SIGKILL)
        await anyio.sleep(0.5)
        r = await h.run("result = counts['a']", session=s)
        assert r["result"] == 2 and "counts" in r["restored"]["restored"], r["restored"]


async def test_a_segfault_under_trusted_then_the_next_call_finds_the_variables(short_tmp: Path) -> None:
    """A crash in native code (ctypes reading address 0, allowed under the trusted profile): SIGSEGV kills
    the kernel; the next call finds what the last finished cell left, loaded from the checkpoint."""
    async with serving(make_settings(short_tmp, profile="trusted")) as h:
        s = await h.new_session()
        await h.run("rows = [{'k': i} for i in range(1000)]\nlabel = 'before the crash'", session=s)
        status = await settled(h, s)
        assert {"rows", "label"} <= set(status["saved"]), status
        dead = await h.client.call_tool("execute_code", {"code": "import ctypes\nctypes.string_at(0)", "session": s})
        assert dead.structured_content["ending"] == "kernel_died", dead.structured_content
        assert "SIGSEGV" in (dead.structured_content["restart_reason"] or ""), dead.structured_content
        r = await h.run("result = (len(rows), rows[-1], label)", session=s)
        assert r["result"] == [1000, {"k": 999}, "before the crash"], r
        assert {"rows", "label"} <= set(r["restored"]["restored"]) and r["restored"]["reran"] == [], r["restored"]
        assert "restored" in r["restart_reason"] and "from the checkpoint" in r["restart_reason"], r


async def test_out_of_memory_then_the_next_call_finds_the_variables(short_tmp: Path) -> None:
    """Both memory limits of a 300 MiB kernel: RLIMIT_DATA turns a big allocation into MemoryError and the
    kernel (and its variables) lives on; shared anonymous memory escapes RLIMIT_DATA and the cgroup's hard
    cap (memory_mb + 512 MiB) OOM-kills the kernel, and the next call finds the variables from the checkpoint."""
    from kernelexec.sandbox.probe import probe

    async with serving(make_settings(short_tmp, profile="trusted", memory_mb=300, pool_size=0)) as h:
        s = await h.new_session()
        await h.run("weights = [float(i) for i in range(50_000)]\nepoch = 7", session=s)
        status = await settled(h, s)
        assert {"weights", "epoch"} <= set(status["saved"]), status
        soft = await h.client.call_tool("execute_code", {"code": "blob = bytearray(600 * 1024 * 1024)", "session": s})
        assert soft.structured_content["error_type"] == "MemoryError", soft.structured_content
        r = await h.run("result = (len(weights), epoch)", session=s)
        assert r["result"] == [50_000, 7] and r.get("restored") is None, r  # same kernel: nothing to restore
        # len(weights) read it, so it is saved again after this cell with result: a next cell that starts first (a
        # loaded machine) drops that save, and the death below then recomputes both (cells 1 and 3 re-ran)
        await settled(h, s)
        if probe().cgroup is None:
            pytest.fail("needs a writable cgroup hierarchy for the OOM kill (run as root, as CI does)")
        code = "import mmap\nm = mmap.mmap(-1, 1536 * 1024 * 1024)\nfor i in range(0, len(m), 4096):\n    m[i] = 1"
        dead = await h.run(code, session=s, timeout=60)
        assert dead["ending"] == "kernel_died" and "SIGKILL" in dead["restart_reason"], dead
        r = await h.run("result = (len(weights), weights[-1], epoch)", session=s)
        assert r["result"] == [50_000, 49_999.0, 7], r
        assert {"weights", "epoch"} <= set(r["restored"]["restored"]) and r["restored"]["reran"] == [], r["restored"]
        assert "restored" in r["restart_reason"], r


MYMOD_V1 = "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
MYMOD_V2 = "class Point:\n    def __init__(self, x, y):\n        self.coords = (x, y)\n\n    def norm(self):\n        return sum(c * c for c in self.coords)\n"


async def test_an_object_of_a_module_that_changed_is_recomputed_not_loaded_in_its_old_shape(short_tmp: Path) -> None:
    """``p`` is an instance of ``mymod.Point`` (a file in the working directory); the file is edited after
    the save, so unpickling ``p`` would give an object of the new class with the old one's attributes.
    The checkpoint knows which module files ``p`` depends on and refuses it: cell 2 runs again."""
    async with serving(make_settings(short_tmp, profile="trusted")) as harness:  # standard imports no local files
        await _module_that_changed(harness)


async def _module_that_changed(harness: Harness) -> None:
    s = await harness.new_session()
    first = await harness.run(f"open('mymod.py', 'w').write({MYMOD_V1!r})", session=s)  # cell 1 (binds nothing)
    assert first["success"], (first["error"], first["traceback"])
    second = await harness.run("import mymod\np = mymod.Point(3, 4)\nkeep = [1, 2]", session=s)  # cell 2
    assert second["success"], (second["error"], second["traceback"])
    status = await settled(harness, s)
    assert {"p", "keep", "mymod"} <= set(status["saved"]), status
    await harness.run(f"open('mymod.py', 'w').write({MYMOD_V2!r})", session=s)  # cell 3: the module changes
    os.kill(pid_of(harness, s), signal.SIGKILL)
    await anyio.sleep(0.5)
    r = await harness.run("result = (p.norm(), keep)", session=s)
    assert r["result"] == [25, [1, 2]], r
    restored = r["restored"]
    assert "keep" in restored["restored"] and "p" not in restored["restored"], restored
    assert [(c["cell"], c["for_names"]) for c in restored["reran"]] == [(2, ["p"])], restored
    assert "re-ran cell 2 for p" in r["restart_reason"], r


async def test_a_name_the_cell_deleted_does_not_make_restore_run_the_cell_again(harness: Harness) -> None:
    """``parts`` built, turned into ``frame``, then ``del parts``: the checkpoint has everything the cell leaves
    behind, so a restore (and a fork) loads it and runs nothing again (the benchmark's 30 s build cell did rerun)."""
    s = await harness.new_session()
    await harness.run("import time\nparts = []\nfor i in range(3):\n    parts.append(i)\n    time.sleep(0.1)\n"
                      "frame = list(parts)\ndel parts", session=s)
    await settled(harness, s)
    os.kill(pid_of(harness, s), signal.SIGKILL)
    await anyio.sleep(0.5)
    r = await harness.run("result = frame", session=s)
    assert r["result"] == [0, 1, 2] and r["restored"]["reran"] == [], r["restored"]
    assert "frame" in r["restored"]["restored"], r["restored"]
    await harness.call("close_session", session=s)


def _startup_checkpoint() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_checkpoint_probe", Path(__file__).resolve().parents[1] / "startup" / "checkpoint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_cell_stops_a_big_write_within_one_piece(tmp_path: Path) -> None:
    """A save writes a large buffer (an array's, in one pickle write) in pieces, checking between them whether a
    cell has started: the cell waits for one piece at most, not for the whole buffer (200 MB took 0.1-0.5 s)."""
    checkpoint = _startup_checkpoint()
    checks = []

    def stop() -> bool:
        checks.append(1)
        return len(checks) > 2  # a cell starts while the second piece is written

    with open(tmp_path / "f.pkl", "wb") as fh:
        out = checkpoint._Capped(fh, 1 << 30, stop=stop)
        with pytest.raises(checkpoint._Superseded):
            out.write(memoryview(bytearray(40 << 20)))
    assert (tmp_path / "f.pkl").stat().st_size == 2 * checkpoint.WRITE_PIECE < 40 << 20


class _KernelFree:
    """A Checkpointer driven without a kernel: ``cell(code)`` runs code in its namespace and ends the cell as
    IPython's ``post_run_cell`` would; saves start on ``cp._answered()``, as on a kernel's idle status."""

    def __init__(self, tmp_path: Path) -> None:
        import contextlib
        import types

        self.checkpoint = _startup_checkpoint()
        self.shell = types.SimpleNamespace(user_ns={}, user_ns_hidden={})
        self.cp = self.checkpoint.Checkpointer(self.shell, {"checkpoint_dir": str(tmp_path), "checkpoint_cap": 1 << 20},
                                               contextlib.nullcontext)
        self.cp.watching = True

    def cell(self, code: str) -> None:
        import types

        exec(code, self.shell.user_ns)
        self.shell.user_ns.pop("__builtins__", None)
        self.cp.post_run_cell(types.SimpleNamespace(info=types.SimpleNamespace(raw_cell=code)))

    def fill_disk(self) -> None:
        """From now on the disk is full for the manifest's write (and only for it)."""
        import errno

        write = self.cp._write

        def full(name: str, data: bytes) -> None:
            if name == self.checkpoint.MANIFEST:
                raise OSError(errno.ENOSPC, "No space left on device")
            write(name, data)

        self.cp._write = full


def test_a_cells_end_waits_for_the_savers_commit_and_names_its_rebound_name_unsaved(tmp_path: Path) -> None:
    """The race a review found in the first form of the fix: the saver's final commit read ``pending`` before a cell
    rebound ``v`` and wrote ``v``'s older value after the cell's end had looked at (not yet updated) entries and
    committed nothing. The check and the commit are now under the manifest's lock, so the cell's end waits for the
    saver's commit and names ``v`` unsaved. Driven without a kernel: the saver is held inside its final manifest write
    while the cell ends, then let go."""
    import pickle
    import threading

    driven = _KernelFree(tmp_path)
    checkpoint, cp, cell = driven.checkpoint, driven.cp, driven.cell
    cell("v = [1]")
    cp.wait()
    assert "v" in cp.entries
    held, entered, manifest_writes = threading.Event(), threading.Event(), []
    write = cp._write

    def held_write(name: str, data: bytes) -> None:
        if name == checkpoint.MANIFEST:
            manifest_writes.append(1)
            # v = [2]: the cell's end names v unsaved (1), the saver's STALE commit (2), its final one, held here (3)
            if len(manifest_writes) == 3:
                entered.set()
                assert held.wait(30)
        write(name, data)

    cp._write = held_write
    cell("v = [2]")
    cp._answered()  # the answer is out: the saver saves v = [2]
    assert entered.wait(30)
    ended = threading.Thread(target=cell, args=("v = [3]",))  # the next cell ends while the saver's commit is held
    ended.start()
    ended.join(0.5)
    held.set()
    ended.join(30)
    assert not ended.is_alive()
    deadline = time.monotonic() + 30
    while cp.saving:  # the saver's commit done; v = [3] waits for its answer (never sent here)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    manifest = json.loads((tmp_path / checkpoint.MANIFEST).read_bytes())
    if "v" in manifest["vars"]:
        assert pickle.loads((tmp_path / manifest["vars"]["v"]["file"]).read_bytes()) == [3], manifest
    else:
        assert manifest["unsaved"]["v"] == checkpoint.STALE, manifest


@pytest.mark.parametrize("change", ["v = [2]", "v.append(2)"], ids=["rebound", "in-place"])
def test_an_older_value_goes_when_the_manifest_cannot_be_written(tmp_path: Path, change: str) -> None:
    """A full disk: the manifest that should name a changed ``v`` unsaved cannot be written, and the one on disk still
    names ``v``'s older file. That file goes, so a death never loads the older value: a restore names ``v`` as not
    loaded, and the kernel's own status names it unsaved. A rebound name fails at the cell's end (its commit comes
    before the answer); one changed in place, at the saver's. Driven without a kernel."""
    driven = _KernelFree(tmp_path)
    checkpoint, cp, cell = driven.checkpoint, driven.cp, driven.cell
    cell("v = [1]")
    cp._answered()
    cp.wait()
    older = cp.entries["v"]["file"]
    assert (tmp_path / older).exists()
    driven.fill_disk()
    cell(change)
    cp._answered()
    cp.wait()
    assert "No space" in cp.error, cp.error
    assert json.loads((tmp_path / checkpoint.MANIFEST).read_bytes())["vars"]["v"]["file"] == older
    assert not (tmp_path / older).exists()
    assert "v" not in cp.entries and cp.unsaved.get("v") == checkpoint.STALE, (cp.entries, cp.unsaved)
    revived = _KernelFree(tmp_path)  # a new kernel's checkpointer, its namespace empty
    restored = revived.cp.restore()
    assert "v" not in restored["restored"] and "v" in restored["failed"], restored
    assert "v" not in revived.shell.user_ns
