"""Another session (B): its files by path, its kernel's sockets (raw and zmq, signed with its stolen
key or not), its process, its IOPub stream. Judged by B's secrets (file, variable, HMAC key) in no
answer, no file planted in B, B's variable unchanged and B's kernel alive.
"""

from __future__ import annotations

import ast
import json
import secrets
from typing import Any

import anyio
import pytest
import zmq

from kernelexec.layout import IPYTHON_SUBDIR

from .common import (
    MODES,
    PROFILES,
    Attack,
    Target,
    assert_untouched,
    attack,
    cases,
    run_case,
)
from .world import World

pytestmark = pytest.mark.anyio


_ZMQ_SIGNED = """
    # main interpreter (pyzmq is not sub-interpreter safe)
    zmq = M('zmq'); json = M('json'); hmac = M('hmac'); hashlib = M('hashlib'); uuid = M('uuid')
    try:
        key = json.loads(open(P['b_dir'] + '/kernel.json').read())['key'].encode()
    except Exception as e:
        key = b''  # could not steal the key: try an unsigned message
    def message(kind, content):
        header = json.dumps({'msg_id': uuid.uuid4().hex, 'session': uuid.uuid4().hex, 'username': 'x',
                             'msg_type': kind, 'version': '5.3', 'date': '2026-01-01T00:00:00Z'}).encode()
        frames = [header, b'{}', b'{}', json.dumps(content).encode()]
        sig = hmac.new(key, b''.join(frames), hashlib.sha256).hexdigest().encode() if key else b''
        return [b'<IDS|MSG>', sig] + frames
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect('ipc://' + P['b_sockets'][CHANNEL])
    s.send_multipart(message(KIND, CONTENT))
    got = []
    if s.poll(300):
        got = s.recv_multipart()
    s.close(); ctx.term()
    if got:
        raise AssertionError('ESCAPE: session B answered: %r' % got[:3])
"""
CROSS_SESSION: dict[str, Any] = {
    "open-b-file": "out = open(P['b_file']).read()",
    "listdir-b-dir": "out = M('os').listdir(P['b_dir'])",
    "read-b-connection-file": "out = open(P['b_dir'] + '/kernel.json').read()",
    "read-b-journal": "out = open(P['b_dir'] + '/journal.jsonl').read()",
    "write-into-b-dir": "open(P['b_marker'], 'w').write('pwned')",
    "plant-b-ipython-startup": """
        os = M('os')
        d = P['b_ipython_dir'] + '/profile_default/startup'  # B's real IPYTHONDIR
        os.makedirs(d, exist_ok=True)
        open(d + '/00-pwn.py', 'w').write('open(%r, "w")' % P['b_marker'])
    """,
    "b-file-via-proc-pid-root": "out = open(f\"/proc/{P['b_pid']}/root\" + P['b_file']).read()",
    "b-environ-via-proc": "out = open(f\"/proc/{P['b_pid']}/environ\", 'rb').read()",
    "raw-unix-connect-b-sockets": """
        socket = M('socket')
        greeting = b'\\xff' + b'\\0' * 8 + b'\\x7f\\x03\\x01NULL' + b'\\0' * 16 + b'\\0' + b'\\0' * 31
        reached, out = {}, {}
        for name, path in P['b_sockets'].items():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(1)
            try:
                s.connect(path)
                s.sendall(greeting)
                reached[name] = s.recv(64)
            except OSError as e:
                out[name] = repr(e)
            finally:
                s.close()
        if reached:
            raise AssertionError('ESCAPE: CONNECTED to session B: %r' % reached)
    """,
    "raw-unix-connect-b-via-symlink": """
        os = M('os'); socket = M('socket')
        link = P['session_dir'] + '/work/bsk-' + str(id(P))
        os.symlink(P['b_sockets']['shell'], link)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(1)
        try:
            s.connect(link)
            raise AssertionError('ESCAPE: CONNECTED to session B through a symlink')
        finally:
            os.unlink(link)
    """,
    "zmq-hb-echo": """
        # main interpreter (pyzmq is not sub-interpreter safe)
        zmq = M('zmq')
        ctx = zmq.Context(); s = ctx.socket(zmq.REQ); s.setsockopt(zmq.LINGER, 0)
        s.connect('ipc://' + P['b_sockets']['hb'])
        s.send(b'ping-from-A')
        echoed = s.recv() if s.poll(300) else None
        s.close(); ctx.term()
        if echoed:
            raise AssertionError('ESCAPE: B heartbeat ECHO %r' % echoed)
    """,
    "zmq-shell-execute-in-b": _ZMQ_SIGNED.replace("CHANNEL", "'shell'").replace("KIND", "'execute_request'").replace(
        "CONTENT", "{'code': 'bsecret = \"PWNED\"\\nopen(%r, \"w\")' % P['b_marker'], 'silent': False}"),
    "zmq-control-shutdown-b": _ZMQ_SIGNED.replace("CHANNEL", "'control'").replace("KIND", "'shutdown_request'").replace(
        "CONTENT", "{'restart': False}"),
    "kill-b-kernel": "M('os').kill(P['b_pid'], 9)",
    "pidfd-b-kernel-getfd": "os = M('os'); fd = os.pidfd_open(P['b_pid']); out = check(libc().syscall(438, fd, 3, 0), 'pidfd_getfd')",
    # refused, unless this kernel is B's tracer already (an earlier attempt of the same run seized it): both escapes
    "ptrace-b-kernel": "r = libc().syscall(101, 0x4206, P['b_pid'], 0, 0); tracer = [l.split()[1] for l in "
                       "open('/proc/%d/status' % P['b_pid']) if l.startswith('TracerPid:')][0] if r else ''; "
                       "check(r, 'ptrace SEIZE') if r and tracer != str(M('os').getpid()) else None",
}


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(CROSS_SESSION))
async def test_other_session(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    t = targets[profile]
    attacks = await run_case(world, targets, "other-session", profile, name, code, modes)
    results = [a.result for a in attacks]
    if "check(" in code:  # a syscall on session B's kernel, checked: completing means the kernel did it to B
        assert not [r for r in results if r.startswith("completed")], f"{results}: {name} succeeded against session B"
    planted = t.dirs["b"] / IPYTHON_SUBDIR / "profile_default/startup/00-pwn.py"
    assert not planted.exists(), f"{results}: a startup file was planted in session B"
    r = await t.h.run("bsecret", session=t.handles["b"])
    assert r["result"] == t.b_var_secret, f"{results}: session B's variable changed: {r}"


SPY_WINDOW = 8.0  # seconds each spy listens after it is ready; the victims print inside it (checked, not assumed)


async def test_other_session_iopub_cannot_be_sniffed(world: World, targets: dict[str, Target]) -> None:
    """A subscribes to B's IOPub socket while B prints its secret (libzmq: no audit events; os-level only).

    Positive controls, so that silence means something: each spy says "ready" (on its own IOPub, watched from
    the host) once it has subscribed to B, and the victims print only after every spy is ready; the spies'
    listening windows are checked to cover the victims' prints; and the same subscription made from the host
    at the same time (nothing in its way) must see B's secret, or the spies' silence proves nothing. (A spy
    cannot prove its own socket works from inside: the OS layers refuse it its own kernel's sockets too.)"""
    sniff = """
        # main interpreter (pyzmq is not sub-interpreter safe)
        zmq = M('zmq'); time = M('time'); sys = M('sys')
        ctx = zmq.Context()
        s = ctx.socket(zmq.SUB); s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SUBSCRIBE, b'')
        s.connect('ipc://' + P['b_sockets']['iopub'])
        got = []
        ready = time.time()
        until = ready + P['window']
        while time.time() < until:
            print(P['token'] + '-ready'); sys.stdout.flush()  # (again and again: the host may subscribe late)
            if s.poll(200):
                got.append(s.recv_multipart())
        s.close(); ctx.term()
        out = {'ready': ready, 'until': time.time(), 'got': got}
    """
    spies: dict[tuple[str, str], Attack] = {}
    tokens = {(p, m): f"KXRTSPY{secrets.token_hex(6)}" for p in PROFILES for m in MODES}
    seen: set[tuple[str, str]] = set()
    printed: dict[str, tuple[float, float]] = {}
    host_saw: set[str] = set()

    def own_iopub(t: Target, mode: str) -> str:
        conn = json.loads(t.h.sessions.get(t.handles[mode]).kernel.connection_file.read_text())
        return f"{conn['ip']}-{conn['iopub_port']}"

    async def watch_ready(t: Target, mode: str) -> None:  # the host, on the spy kernel's own IOPub
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect("ipc://" + own_iopub(t, mode))
        wanted = tokens[t.profile, mode].encode() + b"-ready"
        try:
            with anyio.fail_after(60):
                while (t.profile, mode) not in seen:
                    try:
                        if any(wanted in f for f in sub.recv_multipart(zmq.NOBLOCK)):
                            seen.add((t.profile, mode))
                    except zmq.Again:
                        await anyio.sleep(0.02)
        finally:
            sub.close()
            ctx.term()

    async def host_control(t: Target) -> None:  # the same subscription to B, from the host: it must see the secret
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect("ipc://" + t.b_sockets["iopub"])
        try:
            with anyio.fail_after(90):
                while t.profile not in printed or t.profile not in host_saw:
                    try:
                        if any(t.b_var_secret.encode() in f for f in sub.recv_multipart(zmq.NOBLOCK)):
                            host_saw.add(t.profile)
                    except zmq.Again:
                        await anyio.sleep(0.02)
        except TimeoutError:
            pass  # judged below
        finally:
            sub.close()
            ctx.term()

    async def spy(t: Target, mode: str) -> None:
        spies[t.profile, mode] = await attack(
            world, t, mode, sniff, f"iopub-{t.profile}-{mode}", category="other-session", name="zmq-sub-b-iopub",
            extra={"_main": True, "own_iopub": own_iopub(t, mode), "token": tokens[t.profile, mode], "window": SPY_WINDOW})

    async def victim(t: Target) -> None:
        with anyio.fail_after(60):  # every spy of this profile subscribed to B, as seen from the host
            while not all((t.profile, m) in seen for m in MODES):
                await anyio.sleep(0.02)
        r = await t.h.run("import time\nfirst = time.time()\nfor _ in range(6):\n    print(bsecret)\n    time.sleep(0.15)\n"
                          "result = [first, time.time()]", session=t.handles["b"])
        assert t.b_var_secret in r["stdout"]  # B really printed it
        printed[t.profile] = tuple(r["result"])

    async with anyio.create_task_group() as tg:  # every spy and both victims at once
        for profile in PROFILES:
            tg.start_soon(victim, targets[profile])
            tg.start_soon(host_control, targets[profile])
            for mode in MODES:
                tg.start_soon(watch_ready, targets[profile], mode)
                tg.start_soon(spy, targets[profile], mode)
    for (profile, mode), a in spies.items():
        await assert_untouched(world, targets[profile], a)
        assert a.result.startswith(("completed:", "[hook disarmed] completed:")), f"[{mode}] the spy did not run: {a.result}"
        found = ast.literal_eval(a.result.split("completed: ", 1)[1])
        assert profile in host_saw, f"[{profile}] the control: the host's own subscription to B's IOPub did not see B print"
        first, last = printed[profile]
        assert found["ready"] <= first and last <= found["until"], (
            f"[{profile}/{mode}] the spy did not listen while B printed (listened {found['ready']:.2f}-{found['until']:.2f}, "
            f"B printed {first:.2f}-{last:.2f})")
