"""The in-kernel guard's own bypasses (guard mode only), each followed by the same real attempts
(write, read, spawn, fork, connect, signal): what the OS layers still stop once the guard is out of the
way, judged by the same side effects. Also a bypass persisted by an IPython start-up file in IPYTHONDIR.
"""

from __future__ import annotations

import os
import secrets
import textwrap
from typing import Any

import pytest

from kernelexec.layout import IPYTHON_SUBDIR

from .common import PROFILES, Target, assert_untouched, attack
from .world import World

pytestmark = pytest.mark.anyio


_AFTER_BYPASS = """

def _attempts():
    res = {}
    def fork():
        os = M('os')
        pid = os.fork()
        if pid == 0:
            open(P['marker'], 'w'); os._exit(0)
        os.waitpid(pid, 0)
    def system():
        wc = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]
        return wc.__init__.__globals__['system'](P['shcmd'])
    for what, fn in [
        ('write-outside', lambda: open(P['new'], 'w').write('pwned')),
        ('modify-readonly', lambda: open(P['ro_canary'], 'a').write('pwned')),
        ('read-secret', lambda: open(P['secret']).read()),
        ('posix_spawn', lambda: M('os').posix_spawn('/bin/sh', ['sh', '-c', P['shcmd']], {})),
        ('fork', fork),
        ('os.system', system),
        ('tcp-connect', lambda: M('socket').create_connection(('127.0.0.1', P['tcp']), timeout=2).send(b'pwned')),
        ('udp-send', lambda: M('socket').socket(2, 2).sendto(b'pwned', ('127.0.0.1', P['udp']))),
        ('unix-connect-host', lambda: M('socket').socket(1, 1).connect(P['unix'])),
        ('kill-server', lambda: M('os').kill(P['pid'], 10)),
    ]:
        try:
            res[what] = 'SUCCEEDED: %r' % (fn(),)
        except BaseException as e:
            res[what] = '%s: %s' % (type(e).__name__, e)
    return res
"""
GUARD_BYPASSES: dict[str, Any] = {
    "guard-module-globals": ("""
        g = M('sys').modules['_kernelexec_guard']
        for k in ('_TAMPER_EVENTS', '_PROCESS_EVENTS', '_NETWORK_EVENTS', '_READ_EVENTS', '_WRITE_EVENTS', '_TWO_PATH_EVENTS'):
            setattr(g, k, frozenset())
        g._norm = lambda p: None
        out = _attempts()
    """, {"dirty": True}),
    "closure-cell_contents-from-traceback": ("""
        try:
            open(P['new'], 'w')
        except BaseException as e:
            tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_name != 'audit':
            tb = tb.tb_next
        check_path = tb.tb_frame.f_locals['check_path']
        cells = dict(zip(check_path.__code__.co_freevars, check_path.__closure__))
        cells['file_io'].cell_contents = 'all'  # no audit event for a cell write
        out = _attempts()
    """, {"dirty": True}),
    "ctypes-memmove-audit-closure": ("""
        ct = M('ctypes')
        try:
            open(P['new'], 'w')
        except BaseException as e:
            tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_name != 'audit':
            tb = tb.tb_next
        def rd(addr):
            b = bytes(8); ct.memmove(id(b) + 32, addr, 8); return int.from_bytes(b, 'little')
        def wr(addr, obj):
            b = id(obj).to_bytes(8, 'little'); ct.memmove(addr, id(b) + 32, 8)
        hook = ct.cast(rd(rd(id(tb.tb_frame) + 24)), ct.py_object).value
        cells = dict(zip(hook.__code__.co_freevars, hook.__closure__))
        for name in ('deny_process', 'deny_network', 'deny_tamper'):
            wr(id(cells[name]) + 16, False)
        inner = cells['check_path'].cell_contents
        wr(id(dict(zip(inner.__code__.co_freevars, inner.__closure__))['file_io']) + 16, 'all')
        out = _attempts()
        c = libc()  # ctypes is now usable too: straight to libc
        out['libc-creat'] = c.creat(P['var_new'].encode(), 0o644), ct.get_errno()
        out['libc-fork'] = c.fork(), ct.get_errno()
        if out['libc-fork'][0] == 0:
            M('os')._exit(0)
    """, {"dirty": True}),
    "runtime-bypass-context": """
        runtime = M('builtins')._kernelexec_report.__self__
        with runtime.bypass():
            out = _attempts()
    """,
    "rebind-builtins-__import__": """
        bi = M('builtins')
        real = ([c.cell_contents for c in (getattr(bi.__import__, '__closure__', None) or ())
                 if getattr(c.cell_contents, '__name__', '') == '__import__'] or [bi.__import__])[0]  # (no guard: as is)
        bi.__import__ = real
        import subprocess
        out = _attempts()
        out['subprocess.run'] = repr(subprocess.run(['/bin/sh', '-c', P['shcmd']]))
    """,
    "reset-f": """
        M('IPython').get_ipython().run_line_magic('reset', '-f')
        out = _attempts()
    """,
    "gc.get_objects": """
        try:
            found = [o for o in M('gc').get_objects() if getattr(o, '__name__', '') == 'audit']
        except BaseException as e:
            found = repr(e)
        out = {'gc': found, **_attempts()}
    """,
    "code-crafting-CodeType-and-replace": """
        c = compile('x = 1', '<kxrt>', 'exec')
        res = {}
        try:
            res['replace'] = repr(c.replace(co_consts=(2, None)))
        except BaseException as e:
            res['replace'] = repr(e)
        try:
            res['CodeType'] = repr(M('types').CodeType(*[getattr(c, a) for a in (
                'co_argcount', 'co_posonlyargcount', 'co_kwonlyargcount', 'co_nlocals', 'co_stacksize', 'co_flags',
                'co_code', 'co_consts', 'co_names', 'co_varnames', 'co_filename', 'co_name', 'co_qualname',
                'co_firstlineno', 'co_linetable', 'co_exceptiontable')]))
        except BaseException as e:
            res['CodeType'] = repr(e)
        out = {**res, **_attempts()}
    """,
    "marshal-crafted-code": """
        marshal = M('marshal')
        src = compile("import os as _o\\n_o.system(P['shcmd'])\\nopen(P['new'], 'w')", '<kxrt>', 'exec')
        crafted = marshal.loads(marshal.dumps(src).replace(b'<kxrt>', b'<xxxx>'))
        try:
            exec(crafted, {'P': P})
            res = 'ran'
        except BaseException as e:
            res = repr(e)
        out = {'marshal': res, **_attempts()}
    """,
    "sub-interpreter-direct": """
        res = {}
        src = "open(%r, 'w')" % P['new']
        for name, go in (  # whichever this Python has: 3.11/3.12, 3.13, and CPython's test modules (3.11-3.13)
                ('_xxsubinterpreters', lambda si: si.run_string(si.create(), src)),
                ('_interpreters', lambda si: si.exec(si.create(), src)),
                ('_testcapi', lambda si: si.run_in_subinterp(src)),
                ('_testinternalcapi', lambda si: si.exec_interpreter(si.create_interpreter(), src))):
            try:
                res[name] = go(M(name))
            except BaseException as e:
                res[name] = repr(e)
        out = {'subinterpreter': res, **_attempts()}
    """,
    "from-a-thread": """
        th = M('threading'); box = {}
        t = th.Thread(target=lambda: box.update(_attempts()))
        t.start(); t.join(10)
        out = box
    """,
    "atexit-and-del-callbacks": """
        class Later:
            def __del__(self):
                try:
                    open(P['new'], 'w')
                except BaseException:
                    pass
        Later()
        M('weakref').finalize(Later(), lambda: M('os').system(P['shcmd']))
        out = _attempts()
    """,
}


def _bypass_cases() -> list[Any]:
    out = []
    for name, spec in GUARD_BYPASSES.items():
        code, opts = (spec, {}) if isinstance(spec, str) else spec
        for profile in PROFILES:
            out.append(pytest.param(profile, name, code, bool(opts.get("dirty")), id=f"{profile}-guard-{name}"))
    return out


@pytest.mark.parametrize(("profile", "name", "code", "dirty"), _bypass_cases())
async def test_guard_bypass_then_os_layers(world: World, targets: dict[str, Target], profile: str, name: str, code: str,
                                           dirty: bool) -> None:
    t = targets[profile]
    tag = f"{name}-{profile}-{secrets.token_hex(3)}"
    a = await attack(world, t, "guard", textwrap.dedent(_AFTER_BYPASS) + textwrap.dedent(code), tag,
                     category="guard-bypass", name=name, role="bypass")
    try:
        await assert_untouched(world, t, a)  # ("SUCCEEDED" in a.result only means a call returned; the side effects judge)
    finally:
        if dirty:  # this technique leaves the guard disarmed in that kernel: start a fresh one
            await t.h.call("restart_session", session=t.handles["bypass"])


@pytest.mark.parametrize("profile", PROFILES)
async def test_no_ipython_startup_file_can_be_planted_to_disarm_the_next_kernel(world: World, targets: dict[str, Target],
                                                                               profile: str) -> None:
    """IPython runs the profile start-up files of IPYTHONDIR (``<session>/ipython``, launch.py; layout.IPYTHON_SUBDIR)
    *before* the kernel's exec_files (kernel_init.py): a planted file that shadows sys.addaudithook would start every
    later kernel of the session, restarts included, without the audit hook while still reporting its policy active.
    That directory is the server's, read-only to the kernel. The plant is tried with the guard's file checks off
    (guard mode) and with no hook at all (os mode, the OS layers alone); it is judged by the directory's content and,
    in kernels started after it (two restarts: the first may take a spare started before it), by the hook still
    refusing what only the hook refuses (a read of the outside secret: PolicyError, where the OS layers would say
    PermissionError or FileNotFoundError)."""
    t = targets[profile]
    startup = t.dirs["bypass"] / IPYTHON_SUBDIR / "profile_default" / "startup"
    assert startup.is_dir(), f"no IPython start-up directory at {startup}: IPYTHONDIR moved, this test attacks nothing"
    before = sorted(os.listdir(startup))
    plant = """
        g = M('sys').modules.get('_kernelexec_guard')  # guard mode: switch the file checks off first
        if g is not None:
            g._WRITE_EVENTS = g._TWO_PATH_EVENTS = frozenset(); g._norm = lambda p: None
        os = M('os')
        d = P['ipython_dir'] + '/profile_default/startup'
        os.makedirs(d, exist_ok=True)
        open(d + '/00-kxrt.py', 'w').write('import sys\\nsys.addaudithook = lambda hook: None\\n')
        out = 'planted'
    """
    hook_only = "out = open(P['secret']).read()"
    try:
        armed = await attack(world, t, "guard", hook_only, f"armed-{profile}", category="guard-bypass",
                             name="ipython-startup-file (control)", role="bypass")
        assert "PolicyError" in armed.result, f"the control: the hook refuses a read of the secret first: {armed.result}"
        attempts = []
        for mode in ("guard", "os"):
            attempts.append(await attack(world, t, mode, plant, f"startup-{profile}-{mode}", category="guard-bypass",
                                         name="ipython-startup-file", role="bypass"))
        results = [a.result for a in attempts]
        assert sorted(os.listdir(startup)) == before, f"{results}: a start-up file was planted in IPYTHONDIR: {os.listdir(startup)}"
        await assert_untouched(world, t, *attempts)
        for _ in range(2):
            await t.h.call("restart_session", session=t.handles["bypass"])
        after = await attack(world, t, "guard", hook_only, f"startup-{profile}-{secrets.token_hex(3)}", category="guard-bypass",
                             name="ipython-startup-file (hook after restart)", role="bypass")
        assert "PolicyError" in after.result, f"{results}: a restarted kernel started without the guard's hook: {after.result}"
        a = await attack(world, t, "guard", textwrap.dedent(_AFTER_BYPASS) + "out = _attempts()",
                         f"startup-{profile}-{secrets.token_hex(3)}", category="guard-bypass",
                         name="ipython-startup-file (after restart)", role="bypass")
        await assert_untouched(world, t, after, a)
    finally:
        for name in set(os.listdir(startup)) - set(before):
            (startup / name).unlink()
        await t.h.call("restart_session", session=t.handles["bypass"])
