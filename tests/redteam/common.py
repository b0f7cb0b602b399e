"""What every red-team module shares: the attacked servers, one attack and its judgement.

Every payload runs in the ``standard`` and the ``strict`` profile, from two attacker sessions at once,
in ``guard`` mode (behind the in-kernel guard) and in ``os`` mode (the guard switched off first: the
OS layers alone); see runner.py. A payload is judged by its side effects, never by its error message:
``assert_untouched`` checks the outside world (world.py) after every attempt. ``OUTCOMES`` keeps every
attempt's answer (``KXRT_REDTEAM_TALLY=<file>`` dumps it at the end, for the tally in docs/security.md).
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import socket
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernelexec.layout import IPYTHON_SUBDIR

from .. import support
from ..support import Harness, make_settings, start_harness
from .runner import NOT_INSTALLED, attack_cell, install_cell
from .world import World, digest, drain, is_kernel_of, kernel_pids, restore, still_alive

PROFILES = ["standard", "strict"]
MODES = ["guard", "os"]
OUTCOMES: list[dict[str, Any]] = []  # every attempt's answer, for the tally (KXRT_REDTEAM_TALLY=<file> dumps it)


# --- the attacked servers -------------------------------------------------------------------------
@dataclass
class Target:
    profile: str
    h: Harness
    cm: Any
    state_dir: Path
    handles: dict[str, str] = field(default_factory=dict)  # "guard", "os" (attackers), "b" (victim)
    dirs: dict[str, Path] = field(default_factory=dict)
    b_file: Path | None = None
    b_file_secret: str = ""
    b_var_secret: str = ""
    b_key: str = ""
    b_name_token: str = ""  # the name of a file in B's session directory (a listing of it leaks this)
    b_sockets: dict[str, str] = field(default_factory=dict)

    _b_pid: int = -1

    def b_pid(self) -> int:
        """Session B's live kernel's host pid (the one behind its current connection file, not a spare).
        A positive control: fails rather than hand the cross-session payloads a pid that is no kernel's."""
        if self._b_pid <= 0 or not still_alive(self._b_pid):  # scanning /proc costs ms: only when it changed
            live = self.h.sessions.get(self.handles["b"]).kernel
            assert live is not None, "session B has no kernel: the cross-session attacks would have no victim"
            pids = kernel_pids(self.dirs["b"], live.connection_file)
            assert len(pids) == 1, f"session B's live kernel ({live.connection_file}) not found in /proc: {pids}"
            self._b_pid = pids[0]
        assert is_kernel_of(self._b_pid, self.dirs["b"]), f"pid {self._b_pid} is not session B's kernel"
        return self._b_pid

    def leak_tokens(self) -> dict[str, str]:
        return {
            "session B's secret file": self.b_file_secret,
            "session B's variable": self.b_var_secret,
            "session B's HMAC key": self.b_key,
            "name of a file in session B's directory": self.b_name_token,
        }


async def start_target(world: World, base: Path, profile: str) -> Target:
    settings = make_settings(base, profile=profile, read_dirs=[world.ro_dir])
    h, cm = await start_harness(settings)
    return Target(profile=profile, h=h, cm=cm, state_dir=settings.state_dir)


async def open_sessions(t: Target, roles: tuple[str, ...] = ("guard", "os", "b", "bypass")) -> None:
    """The attackers (one per mode, one for guard bypasses) and the victim B, all started in parallel."""
    async def open_session(role: str) -> None:
        handle = await t.h.new_session()
        r = await t.h.run("1", session=handle)
        t.handles[role] = handle
        t.dirs[role] = Path(r["notebook"]).parent

    async with anyio.create_task_group() as tg:
        for role in roles:
            tg.start_soon(open_session, role)
    t.b_file_secret = f"KXRTBFILE{secrets.token_hex(12)}"
    t.b_var_secret = f"KXRTBVAR{secrets.token_hex(12)}"
    t.b_file = t.dirs["b"] / "work" / "b-secret.txt"
    t.b_file.write_text(f"session B's file: {t.b_file_secret}\n")  # as if B had written it
    t.b_name_token = f"KXRTBNAME{secrets.token_hex(6)}"
    (t.dirs["b"] / t.b_name_token).write_text("listing canary\n")  # in B's own directory, next to its kernel.json
    r = await t.h.run(f"bsecret = {t.b_var_secret!r}", session=t.handles["b"])
    assert r["success"], r
    conn = json.loads((t.dirs["b"] / "kernel.json").read_text())
    t.b_key = conn["key"]
    assert conn["transport"] == "ipc"
    t.b_sockets = {name[: -len("_port")]: f"{conn['ip']}-{conn[name]}" for name in conn if name.endswith("_port")}


# --- one attack and its judgement -----------------------------------------------------------------
def params_for(world: World, t: Target, role: str, tag: str) -> dict[str, Any]:
    me = t.dirs[role]
    return {
        "secret": str(world.secret_file),
        "secret_dir": str(world.secret_dir),
        "ro_dir": str(world.ro_dir),
        "ro_canary": str(world.ro_canary),
        "outside_root": str(world.root),
        "state_dir": str(t.state_dir),
        **world.outside_targets(tag),
        "state_new": str(t.state_dir / f"created-{tag}"),
        "tcp": world.tcp.getsockname()[1],
        "tcp6": world.tcp6.getsockname()[1] if world.tcp6 else None,
        "udp": world.udp.getsockname()[1],
        "unix": str(world.unix_path),
        "abstract": world.abstract_name,
        "pid": world.pid,
        "secret_fd": world.secret_fd,  # the server holds the secret file open at this descriptor
        "pgid": os.getpgrp(),
        "mem_addr": id(world.mem_secret) + 32,  # PyBytesObject data in this (the server's) process
        "mem_len": len(world.mem_secret),
        "session_dir": str(me),
        # where the kernel's interpreter lives (the server's, as the test's): read-only fds there are no leak. Told, not
        # read in the kernel: os mode's sub-interpreter reports the base install as sys.prefix, never the venv
        "interpreter_trees": sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}),
        "ipython_dir": str(me / IPYTHON_SUBDIR),  # IPYTHONDIR (launch.py): where IPython reads start-up files
        "marker": str(me / "work" / f"spawned-{tag}"),
        "shcmd": f"echo spawned > {me / 'work' / f'spawned-{tag}'}",
        "b_dir": str(t.dirs["b"]),
        "b_ipython_dir": str(t.dirs["b"] / IPYTHON_SUBDIR),
        "b_file": str(t.b_file),
        "b_marker": str(t.dirs["b"] / "work" / f"pwned-{tag}"),
        "b_sockets": t.b_sockets,
        "b_pid": t.b_pid(),
    }


def attack_timeout() -> float:
    """Seconds an attack cell may run. A refused attack answers in about a second; 30 s leaves a loaded CI machine
    room. Under ``--weaken`` (a layer removed, so attacks succeed) some successful attacks hang until this timeout
    (pty.spawn, pty.fork, os.fork without bubblewrap: 30 s each), and the run exists only to show each judge goes red,
    which tests/weakening.py enforces (a judge that passes there ends the run with status 7): 10 s."""
    return 10.0 if support.WEAKEN is not None else 30.0


@dataclass
class Attack:
    answer: dict[str, Any]
    result: str
    params: dict[str, Any]
    mode: str = ""


def whole_result(path: Path) -> str:
    """A result the answer cut, whole from its ``result_file`` (a string result is kept there as JSON)."""
    text = path.read_text(errors="replace")
    try:
        decoded = json.loads(text)
    except ValueError:
        return text
    return decoded if isinstance(decoded, str) else text


async def attack(world: World, t: Target, mode: str, payload: str, tag: str, *, category: str, name: str,
                 extra: dict[str, Any] | None = None, role: str | None = None) -> Attack:
    """Send one attack cell from session ``role`` (default: the session kept for ``mode``)."""
    role = role or mode
    world.inotify.events()  # forget our own earlier reads
    params = params_for(world, t, role, tag) | (extra or {})
    cell = attack_cell(textwrap.dedent(payload), params, mode)
    answer = await t.h.run(cell, session=t.handles[role], timeout=attack_timeout())
    if answer.get("result") == NOT_INSTALLED:  # a fresh kernel: install the helpers, then attack
        installed = await t.h.run(install_cell(mode), session=t.handles[role], timeout=attack_timeout())
        assert installed["success"], installed
        answer = await t.h.run(cell, session=t.handles[role], timeout=attack_timeout())
    result = answer.get("result")
    result = result if isinstance(result, str) else json.dumps(answer.get("result"))
    if answer.get("result_file"):  # past the answer's cap: judged whole (a long /proc listing cut before the server's line judged nothing)
        result = whole_result(Path(answer["result_file"]))
    if not answer.get("success"):
        result = f"cell failed: {answer.get('error')} ending={answer.get('ending')} {answer.get('restart_reason') or ''}"
    if mode == "os" and result.startswith("DISARM FAILED"):  # a failure, never a skip: os mode that does not run judges nothing
        pytest.fail(f"os mode could not switch the in-kernel guard off, so the OS layers alone were not attacked: {result}")
    OUTCOMES.append({"category": category, "profile": t.profile, "mode": mode, "payload": name, "result": result[:300]})
    return Attack(answer=answer, result=result, params=params, mode=mode)


async def assert_untouched(world: World, t: Target, *attacks: Attack) -> None:
    """The side effects every attempt is judged on, whatever it tried (several attempts: judged together,
    each attributed where the evidence carries its tag: files it created, its marker, its own answer)."""
    problems = []
    await anyio.sleep(0)  # a signal that reached us has been delivered already; its handler runs at the next bytecode
    events = world.inotify.events()  # first: our own checks below list and read the watched directories
    if events:
        problems.append(f"outside files were touched: {events}")
    for a in attacks:
        text = json.dumps(a.answer)
        for what, token in (world.leak_tokens() | t.leak_tokens()).items():
            if token and token in text:
                problems.append(f"[{a.mode}] LEAK: {what} appears in the answer")
        for key in ("new", "var_new", "ro_new", "state_new"):
            made = glob.glob(glob.escape(a.params[key]) + "*")
            if made:
                problems.append(f"[{a.mode}] created outside: {made}")
                for path in made:
                    shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        for key in ("marker", "b_marker"):
            if os.path.lexists(a.params[key]):
                problems.append(f"[{a.mode}] a spawned/foreign process ran: {a.params[key]} exists")
                os.unlink(a.params[key])
        if "AssertionError" in a.result:
            problems.append(f"[{a.mode}] the payload saw its own attack succeed (AssertionError/ESCAPE in its result)")
    # (each judged, then put back: the next attack is judged on an untouched world, not on this one's damage)
    for what, path, content, state in (("the read-only canary", world.ro_canary, world.ro_content, world.ro_state),
                                       ("the secret file", world.secret_file, world.secret_content, world.secret_state)):
        try:
            changed = digest(path) != state
        except OSError:
            changed = True
        if changed:
            problems.append(f"{what} changed")
            restore(path, content)
            if path == world.ro_canary:
                world.ro_state = digest(path)
            else:
                world.secret_state = digest(path)
    world.inotify.events()  # our own globs and digests
    for name, sock in world.listeners.items():
        got = drain(sock)
        if got:
            problems.append(f"the {name} listener received: {got}")
    if world.signals:
        problems.append(f"the server process received signals: {dict(world.signals)}")
        world.signals.clear()
    if socket.gethostname() != world.hostname:
        problems.append(f"the host's hostname changed to {socket.gethostname()!r}")
        socket.sethostname(world.hostname)  # put back at once: it is the whole machine's
    b_pid = attacks[0].params["b_pid"] if attacks else -1
    assert b_pid > 0, "no victim pid: the attacks on session B's kernel attacked nothing"
    if not still_alive(b_pid):
        problems.append("session B's kernel was killed")
    results = "\n".join(f"[{a.mode}] {a.result}" for a in attacks)
    assert not problems, f"{results}\n" + "\n".join(problems)


def cases(table: dict[str, str | tuple[str, dict[str, Any]]]) -> list[Any]:
    """pytest params: profile x payload; the modes of one payload run at once (different sessions, in parallel)."""
    out = []
    for name, spec in table.items():
        code, opts = (spec, {}) if isinstance(spec, str) else spec
        for profile in opts.get("profiles", PROFILES):
            modes = tuple(opts.get("modes", MODES))
            out.append(pytest.param(profile, name, code, modes, id=f"{profile}-{name}"))
    return out


async def run_case(world: World, targets: dict[str, Target], category: str, profile: str, name: str, code: str,
                   modes: tuple[str, ...]) -> list[Attack]:
    """The payload from each mode's attacker session at once, then the side effects of all of them."""
    t = targets[profile]
    extra = {"_main": True} if code.lstrip().startswith("# main interpreter") else None
    attacks: dict[str, Attack] = {}

    async def one(mode: str) -> None:
        tag = f"{name}-{profile}-{mode}-{secrets.token_hex(3)}"
        attacks[mode] = await attack(world, t, mode, code, tag, category=category, name=name, extra=extra)

    async with anyio.create_task_group() as tg:
        for mode in modes:
            tg.start_soon(one, mode)
    ordered = [attacks[m] for m in modes]
    await assert_untouched(world, t, *ordered)
    return ordered
