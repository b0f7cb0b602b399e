"""The server as confused deputy: it runs as root outside every sandbox and writes/reads files in
the session directory, which the kernel can write. Plant symlinks there (journal, outputs, session
file, kernel.log, ipc/ sockets), then let the server act. Judged by nothing written or read outside,
and the server not connecting to a host socket.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from .common import MODES, PROFILES, Target, assert_untouched, attack
from .world import World, drain, kernel_pids, still_alive

pytestmark = pytest.mark.anyio


_PLANT = """
    # main interpreter (IPython's state lives there)
    os = M('os')
    sd = P['session_dir']
    target = P['new'] if P['_mode'] == 'os' else P['ro_new']  # the guard only lets a symlink point at a readable path
    ec = M('IPython').get_ipython().execution_count
    stems = ['cell%d-%d' % (n, s) for n in range(ec - 1, ec + 3) for s in range(P['seq'], P['seq'] + 4)]
"""
SERVER_DEPUTY: dict[str, tuple[str, str]] = {
    # the journal is appended (open(..., 'a')) by the server after every call, this very call included
    "journal.jsonl-symlink": (_PLANT + """
    os.remove(sd + '/journal.jsonl')
    os.symlink(target, sd + '/journal.jsonl')
    """, ""),
    # stdout longer than --stream-chars is written by the server to outputs/<stem>-stdout.txt
    "outputs-stdout-spill-symlink": (_PLANT + """
    for stem in stems:
        os.symlink(target, sd + '/outputs/' + stem + '-stdout.txt')
    """, "print('* * * * * root cron line or authorized_keys entry of the attacker\\n' + '#' * 30000)"),
    # a result longer than --result-chars is written to outputs/<stem>-result.{json,txt}
    "outputs-result-spill-symlink": (_PLANT + """
    for stem in stems:
        for ext in ('json', 'txt'):
            os.symlink(target, sd + '/outputs/' + stem + '-result.' + ext)
    """, "'attacker-chosen content ' * 400"),
    # every rich output is written to outputs/<stem>-out<i>.<ext>, byte for byte what the kernel sent
    "outputs-rich-output-symlink": (_PLANT + """
    for stem in stems:
        for i in range(3):
            os.symlink(target, sd + '/outputs/' + stem + '-out%d.html' % i)
    """, "display({'text/html': '<!-- exact attacker bytes -->'}, raw=True)"),
}


def _heal(session_dir: Path) -> None:
    """Undo what a deputy attack planted in a session directory (the server needs it afterwards)."""
    for path in [session_dir / "journal.jsonl", session_dir / "kernel.log", session_dir / "outputs", *session_dir.glob("outputs/*")]:
        if path.is_symlink():
            path.unlink()
    (session_dir / "outputs").mkdir(exist_ok=True)


def _deputy_cases() -> list[Any]:
    return [pytest.param(profile, mode, name, id=f"{profile}-{mode}-{name}") for name in SERVER_DEPUTY for profile in PROFILES for mode in MODES]


@pytest.mark.parametrize(("profile", "mode", "name"), _deputy_cases())
async def test_server_writes_through_planted_symlinks(world: World, targets: dict[str, Target], profile: str, mode: str, name: str) -> None:
    t = targets[profile]
    plant, trigger = SERVER_DEPUTY[name]
    seq = t.h.app.renderer(t.h.sessions.sessions[t.handles[mode]])._seq  # = the attacker's count of its own calls
    tag = f"{name}-{profile}-{mode}-{secrets.token_hex(3)}"
    try:
        a = await attack(world, t, mode, plant, tag, category="server-deputy", name=name,
                         extra={"_mode": mode, "seq": seq + 1, "_main": True})
        if trigger:
            a.answer = {"plant": a.answer, "trigger": await t.h.run(trigger, session=t.handles[mode])}
        await assert_untouched(world, t, a)
    finally:
        _heal(t.dirs[mode])


@pytest.mark.parametrize(("profile", "mode"), [(p, m) for p in PROFILES for m in MODES])
async def test_server_resource_read_through_planted_outputs_symlink(world: World, targets: dict[str, Target], profile: str, mode: str) -> None:
    """outputs/ replaced by a symlink to an outside directory; then the client reads a session file resource."""
    t = targets[profile]
    plant = """
        os = M('os')
        sd = P['session_dir']
        os.rename(sd + '/outputs', sd + '/outputs.old')
        os.symlink(P['secret_dir'], sd + '/outputs')
    """
    try:
        a = await attack(world, t, mode, plant, f"res-{profile}-{mode}-{secrets.token_hex(3)}", category="server-deputy",
                         name="outputs-dir-symlink+resource-read")
        try:
            got = await t.h.client.read_resource(f"kernelexec://sessions/{t.handles[mode]}/files/secret.txt")
            a.answer = {"attack": a.answer, "resource": repr(got)}
        except Exception as exc:  # noqa: BLE001 - refused is the good outcome
            a.answer = {"attack": a.answer, "resource": repr(exc)}
        await assert_untouched(world, t, a)
    finally:
        d = t.dirs[mode]
        _heal(d)
        if (d / "outputs.old").is_dir() and not any((d / "outputs").iterdir()):
            (d / "outputs").rmdir()
            (d / "outputs.old").rename(d / "outputs")


async def _throwaway(t: Target) -> tuple[str, Path]:
    handle = await t.h.new_session()
    r = await t.h.run("1", session=handle)
    return handle, Path(r["notebook"]).parent


@pytest.mark.parametrize(("profile", "mode"), [(p, m) for p in PROFILES for m in MODES])
async def test_server_close_session_writes_through_planted_symlink(world: World, targets: dict[str, Target], profile: str, mode: str) -> None:
    """close_session writes .session.json.tmp (write_text follows symlinks) before renaming it over session.json."""
    t = targets[profile]
    handle, d = await _throwaway(t)
    t.handles["throwaway"], t.dirs["throwaway"] = handle, d
    plant = """
        os = M('os')
        target = P['new'] if P['_mode'] == 'os' else P['ro_new']
        os.symlink(target, P['session_dir'] + '/.session.json.tmp')
    """
    a = await attack(world, t, mode, plant, f"close-{profile}-{mode}-{secrets.token_hex(3)}", category="server-deputy",
                     name=".session.json.tmp-symlink+close_session", role="throwaway", extra={"_mode": mode})
    closed = await t.h.call("close_session", session=handle)
    a.answer = {"attack": a.answer, "close": repr(closed.content)}
    await assert_untouched(world, t, a)


@pytest.mark.parametrize(("profile", "mode"), [("standard", "guard"), ("standard", "os"), ("strict", "os")])
async def test_server_reconnects_through_planted_ipc_symlinks(world: World, targets: dict[str, Target], profile: str, mode: str) -> None:
    """The kernel's zmq sockets live in its writable ipc/ directory and the server's client connects to them
    by path. Replace each socket file with a symlink to a host unix socket, then die: while the server notices
    and restarts the kernel, libzmq in the *server* (root, unsandboxed) reconnects through the symlinks."""
    t = targets[profile]
    plant = """
        # main interpreter (the kernel's own connection info)
        os = M('os'); json = M('json')
        conn = json.load(open(P['session_dir'] + '/kernel.json'))
        for name in ('shell', 'iopub', 'control', 'hb', 'stdin'):
            path = '%s-%d' % (conn['ip'], conn[name + '_port'])
            os.remove(path)
            os.symlink(P['unix'], path)
        os._exit(1)
    """
    caught: list[str] = []

    async def watch() -> None:  # accept (and close) at once, or the server's client hangs in a ZMTP handshake for 30 s
        while True:
            caught.extend(drain(world.unix))
            await anyio.sleep(0.05)

    kernel = t.h.sessions.get(t.handles[mode]).kernel
    assert kernel is not None
    old_pids = kernel_pids(t.dirs[mode], kernel.connection_file)
    assert old_pids, "the attacker's kernel not found in /proc"
    def window_closed() -> bool:  # a new kernel listens on real sockets at every path of the kernel's slot again
        # read each time: a restart that swaps the session's warm spare in moves the kernel to its other slot (other
        # paths); the old slot's planted links are then cleared before its next kernel starts (provisioner.py)
        conn = json.loads(kernel.connection_file.read_text())
        sockets = [Path(f"{conn['ip']}-{conn[name]}") for name in conn if name.endswith("_port")]
        fresh = [p for p in kernel_pids(t.dirs[mode], kernel.connection_file) if p not in old_pids]
        return bool(fresh) and all(p.is_socket() and not p.is_symlink() for p in sockets)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        a = await attack(world, t, mode, plant, f"ipc-{profile}-{mode}-{secrets.token_hex(3)}", category="server-deputy",
                         name="ipc-socket-symlinks+die", extra={"_main": True})
        # a payload stopped half-way may leave symlinks behind a live kernel: kill it from the host, so that the
        # server's reconnect-and-restart path runs every time
        for pid in old_pids:
            if still_alive(pid):
                os.kill(pid, signal.SIGKILL)
        # the window closes when the server has restarted the kernel and it has bound real sockets at every path
        # again (no symlink left to follow) and answered a call: wait for that, not for a guess at zmq's interval
        with anyio.fail_after(60):
            while not window_closed() or not await kernel.is_alive():
                await anyio.sleep(0.05)
        assert (await t.h.run("1", session=t.handles[mode]))["result"] == 1
        tg.cancel_scope.cancel()
    caught.extend(drain(world.unix))
    assert not caught, f"[{mode}] {a.result}\nthe server connected to the host unix socket through the kernel's symlinks: {caught}"
    await assert_untouched(world, t, a)


@pytest.mark.parametrize("mode", MODES)
async def test_server_kernel_log_symlink_and_failed_restart(world: World, targets: dict[str, Target], mode: str) -> None:
    """kernel.log -> an outside file, an IPython startup file that writes to stderr and makes every later start
    fail, then die. On the failed restart the server opens kernel.log again ('ab', following the symlink) as the
    new kernel's stderr, and quotes the file's tail in the error it returns. (standard profile: strict adds nothing)"""
    t = targets["standard"]
    handle, d = await _throwaway(t)
    t.handles["throwaway"], t.dirs["throwaway"] = handle, d
    token = f"KXRTVICTIM{secrets.token_hex(10)}"
    # guard mode: the guard lets a symlink point at any readable path (--read-dirs, the venv, the stdlib)
    victim = (world.ro_dir if mode == "guard" else world.root) / f"victim-{secrets.token_hex(4)}.txt"
    victim.write_text(f"host file with a secret: {token}\n")
    plant = """
        os = M('os')
        sd = P['session_dir']
        os.remove(sd + '/kernel.log')
        os.symlink(P['victim'], sd + '/kernel.log')
        startup = P['ipython_dir'] + '/profile_default/startup'  # the real IPYTHONDIR
        os.makedirs(startup, exist_ok=True)
        open(startup + '/00-die.py', 'w').write('import os\\nos.write(2, b"kxrt: appended by the sandboxed kernel\\\\n")\\nos._exit(3)\\n')
        out = 'planted'
    """
    try:
        a = await attack(world, t, mode, plant, f"log-{mode}-{secrets.token_hex(3)}", category="server-deputy",
                         name="kernel.log-symlink+failed-restart", role="throwaway", extra={"victim": str(victim)})
        if "planted" in a.result:  # (when the plant was refused there is nothing for the server to follow)
            died = await t.h.client.call_tool("execute_code", {"code": "import os; os._exit(1)", "session": handle, "timeout": 60})
            a.answer = {"attack": a.answer, "death": repr(died.content), "structured": died.structured_content}
        text = json.dumps(a.answer)
        problems = []
        if token in text:
            problems.append("LEAK: the outside file's content appears in the answer (kernel.log tail)")
        if victim.read_text() != f"host file with a secret: {token}\n":
            problems.append(f"the outside file was written by the server on the kernel's behalf: {victim.read_text()!r}")
        world.inotify.events()  # the victim's own events are judged by the two checks above
        assert not problems, f"{a.result}\n" + "\n".join(problems)
        await assert_untouched(world, t, a)
    finally:
        victim.unlink(missing_ok=True)
        _heal(d)
        try:
            await t.h.call("close_session", session=handle)
        except Exception:  # noqa: BLE001
            pass
