"""The in-kernel policy: an import allowlist, file-access roots and an audit hook.

Loaded by ``kernel_init.py`` inside the kernel process; stdlib only, never imports kernelexec.

This layer gives the model clear, early errors ("Import of subprocess is not allowed in the
'standard' profile. Allowed modules: ...", the old safe executor's words first) and stops honest mistakes. It is **not a security boundary**:
Python code can reach around any in-process guard (object-graph walks, ``sys.modules``,
C extensions). The boundary is the kernel's own process and what the OS puts around it.

State lives in closures and frozensets, never in the user namespace, so ``%reset -f`` and
rebinding names in a cell do not disarm it; the audit hook (PEP 578) cannot be removed from Python,
and it refuses the ``gc`` / frame introspection events a cell would use to find and patch it.
"""

from __future__ import annotations

import builtins
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

# Audit events whose first argument is a path read or written.
_READ_EVENTS = frozenset({"os.listdir", "os.scandir", "glob.glob", "glob.glob/2"})
_WRITE_EVENTS = frozenset(
    {
        "os.mkdir", "os.remove", "os.rmdir", "os.chmod", "os.chown", "os.truncate",
        "os.utime", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
        "shutil.rmtree", "shutil.make_archive",
    }
)
# Events whose first two arguments are both written (source and destination).
_TWO_PATH_EVENTS = frozenset({"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.move"})
_PROCESS_EVENTS = frozenset(
    {
        "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
        "os.forkpty", "os.startfile", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
    }
)
_NETWORK_EVENTS = frozenset(
    {
        "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
        "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.gethostbyname_ex",
        "socket.getnameinfo", "socket.socketpair",
    }
)
# Introspection that would let a cell find and rewrite this guard's state, and native-code access.
_TAMPER_EVENTS = frozenset(
    {
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
        "code.__new__", "function.__new__", "resource.setrlimit", "resource.prlimit",
        "os.setuid", "os.setgid", "os.setreuid", "os.setregid", "os.setresuid", "os.setresgid",
        "sys.setprofile", "sys.settrace", "sys._setprofileallthreads", "sys._settraceallthreads",
        "cpython.PyInterpreterState_New", "_xxsubinterpreters.create", "mmap.__new__",
    }
)


class PolicyError(PermissionError):
    """Raised in the kernel when the session's profile forbids an operation."""


def _norm(path: Any) -> str | None:
    """Absolute, symlink-resolved form of a path argument; None for file descriptors."""
    if isinstance(path, int):
        return None
    try:
        path = os.fsdecode(os.fspath(path))
    except TypeError:
        return None
    return os.path.realpath(path)


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def install(policy: dict[str, Any]) -> Callable[[], Any]:
    """Install the guard described by ``policy`` and return a bypass context for our own writes.

    Called once per kernel process by ``kernel_init.py``. ``policy`` keys: ``profile``,
    ``allowed_imports`` (None = all), ``file_io`` (``"none" | "roots" | "all"``), ``read_roots``,
    ``write_roots``, ``deny_process``, ``deny_network``, ``deny_tamper``.

    The steps run in this order (imports, then the audit hook). Each builds its checks as closures that
    reach one another through closure cells; the step functions are called only here, at boot, so
    rebinding them in ``sys.modules['_kernelexec_guard']`` afterwards changes no installed check.
    """
    profile: str = policy["profile"]
    allowed: set[str] | None = None if policy.get("allowed_imports") is None else set(policy["allowed_imports"])
    file_io: str = policy.get("file_io", "all")
    write_roots = tuple(os.path.realpath(p) for p in policy.get("write_roots", ()))
    read_roots = write_roots + tuple(os.path.realpath(p) for p in policy.get("read_roots", ()))
    # the kernel's Python environment, even where it lies in a writable directory (a project's .venv)
    readonly_roots = tuple(os.path.realpath(p) for p in policy.get("readonly_roots", ()))
    deny_process = bool(policy.get("deny_process"))
    deny_network = bool(policy.get("deny_network"))
    deny_tamper = bool(policy.get("deny_tamper"))
    allowed_hint = policy.get("imports_hint") or ", ".join(sorted(m for m in (allowed or ()) if not m.startswith("_")))
    bypass = threading.local()

    def refuse(what: str) -> PolicyError:
        return PolicyError(f"{what} is not allowed in the {profile!r} profile (kernelexec policy)")

    _guard_imports(policy, profile, allowed, allowed_hint)
    check_path = _path_check(file_io, write_roots, read_roots, readonly_roots, bypass, refuse)
    sys.addaudithook(_audit_hook(check_path, deny_process, deny_network, deny_tamper, refuse))
    return _bypass_context(bypass)


def _guard_imports(policy: dict[str, Any], profile: str, allowed: set[str] | None, allowed_hint: str) -> None:
    """The import allowlist: wraps ``__import__`` and ``importlib.import_module`` for cells.

    One scope for all its closures, so that ``guarded_import``, ``check_import`` and ``allow_more`` share
    one ``allowed`` set (``allow_more`` grows it). ``from_user_code(2)`` counts frames: it must stay called
    directly from the wrappers. Also leaves ``allow_more`` in ``policy["_allow_more"]`` for kernel_init.
    """
    real_import = builtins.__import__
    from importlib.util import find_spec  # before __import__ is wrapped

    # where the session may write (its working directory first): Python source there is the notebook's own code
    own_roots = tuple(os.path.realpath(p) for p in policy.get("write_roots", ())) if policy.get("file_io") == "roots" else ()
    # installed code, even where it lies in a work root (a .venv, kernelexec's own checkout): never the notebook's own
    installed = tuple(os.path.realpath(p) for p in (*policy.get("installed_roots", ()), *policy.get("readonly_roots", ())))
    realpath, inside, stdlib = os.path.realpath, _inside, frozenset(sys.stdlib_module_names)  # bound now: a cell rebinds none

    def own_module(top: str) -> bool:
        """A module of Python source in a folder the session may write: a notebook's helper beside it or one a cell
        wrote (%%writefile), a package of them (a namespace one too), as the project's code in a project environment
        is (policy.py). Not a name of the stdlib (a refused one stays refused) nor kernelexec's, not native code, not
        installed code (a package in a .venv under the working directory)."""
        if not own_roots or top in stdlib or top.startswith("_kernelexec"):
            return False
        try:
            spec = find_spec(top)
        except Exception:  # noqa: BLE001 - not findable: not one
            return False
        origin = getattr(spec, "origin", None)
        places = [origin] if isinstance(origin, str) and origin.endswith(".py") else []
        if origin is None:  # a namespace package: its folders
            places = [p for p in getattr(spec, "submodule_search_locations", None) or () if isinstance(p, str)]
        return bool(places) and all(inside(realpath(p), own_roots) and not inside(realpath(p), installed) for p in places)

    def from_user_code(depth: int) -> bool:
        # Cells (and functions defined in them) run with the user namespace as globals,
        # whose __name__ is '__main__'; library modules carry their own name.
        frame = sys._getframe(depth)
        return frame.f_globals.get("__name__", "__main__") == "__main__"

    def check_import(name: str, from_import: bool = False) -> None:
        """Refuse ``name`` unless the profile allows its top-level module, in the old safe executor's words
        ("Import of os is not allowed", "Import from os.path is not allowed"), then the profile and what it allows."""
        top = name.partition(".")[0]
        if allowed is not None and top not in allowed and not own_module(top):
            # a module that is not there at all is ModuleNotFoundError, as without the guard (a notebook's
            # `except ModuleNotFoundError` and Jupyter's own run agree); one that is there is refused: ImportError
            try:
                missing = top not in sys.modules and find_spec(top) is None  # (None there: blocked, not missing)
            except Exception:  # noqa: BLE001 - a profile without file access cannot look: refused either way
                missing = False
            raise (ModuleNotFoundError if missing else ImportError)(
                f"Import {'from' if from_import else 'of'} {name} is not allowed in the {profile!r} profile. "
                f"Allowed modules: {allowed_hint}",
                name=top,
            )

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        if level == 0 and allowed is not None and from_user_code(2):
            check_import(name, bool(fromlist))
        return real_import(name, globals, locals, fromlist, level)

    def allow_more(names: Any) -> None:
        """Allow top-level modules the server installed into the session's overlay (kernel_init calls it)."""
        if allowed is not None:
            allowed.update(n for n in names if isinstance(n, str) and n not in sys.stdlib_module_names)

    policy["_allow_more"] = allow_more

    if allowed is not None:
        builtins.__import__ = guarded_import
        import importlib

        real_import_module = importlib.import_module

        def guarded_import_module(name: str, package: str | None = None):
            if not name.startswith(".") and from_user_code(2):
                check_import(name)
            return real_import_module(name, package)

        guarded_import_module.__doc__ = real_import_module.__doc__
        importlib.import_module = guarded_import_module


def _path_check(
    file_io: str,
    write_roots: tuple[str, ...],
    read_roots: tuple[str, ...],
    readonly_roots: tuple[str, ...],
    bypass: threading.local,
    refuse: Callable[[str], PolicyError],
) -> Callable[[Any, bool], None]:
    """The file policy for one path: the audit hook calls it for every path an event reads or writes.

    A closure over the profile's roots (no module globals but ``_norm``/``_inside``, as before the split).
    """

    def check_path(path: Any, write: bool) -> None:
        if file_io == "all" or getattr(bypass, "on", False):
            return
        resolved = _norm(path)
        if resolved is None:
            return
        if file_io == "none" and write:
            raise refuse(f"writing files ({path!r})")
        if write and readonly_roots and _inside(resolved, readonly_roots):
            raise refuse(f"writing {path!r} (the kernel's Python environment is read-only)")
        roots = write_roots if write else read_roots
        if not _inside(resolved, roots):
            verb = "writing" if write else "reading"
            where = ", ".join(write_roots) or "nowhere"
            raise refuse(f"{verb} {path!r} (this session may write only under: {where})")

    return check_path


def _audit_hook(
    check_path: Callable[[Any, bool], None],
    deny_process: bool,
    deny_network: bool,
    deny_tamper: bool,
    refuse: Callable[[str], PolicyError],
) -> Callable[[str, tuple[Any, ...]], None]:
    """The audit hook (PEP 578) that ``install`` adds: file, process, network and tamper events.

    Built here so that its closure holds exactly ``check_path``, the three ``deny_*`` flags and ``refuse``.
    """

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = args
            if mode is None:  # os.open: flags decide
                write = bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC))
            else:
                write = any(c in mode for c in "wax+")
            check_path(path, write)
        elif event in _READ_EVENTS:
            check_path(args[0], False)
        elif event in _WRITE_EVENTS:
            check_path(args[0], True)
        elif event == "sqlite3.connect":  # sqlite opens files in C, with no "open" event
            check_path(args[0], True)
        elif event in _TWO_PATH_EVENTS:
            check_path(args[0], event != "os.symlink" and event != "shutil.copyfile")
            check_path(args[1], True)
        elif deny_process and event in _PROCESS_EVENTS:
            if event in ("os.kill", "os.killpg") and args and args[0] in (0, os.getpid()):
                return
            raise refuse(f"starting or signalling processes ({event})")
        elif deny_network and event in _NETWORK_EVENTS:
            if event == "socket.__new__" and len(args) > 1 and args[1] == 1:  # AF_UNIX
                return
            raise refuse(f"network access ({event})")
        elif deny_tamper and (event in _TAMPER_EVENTS or event.startswith("ctypes.")):
            raise refuse(f"{event}")

    return audit


def _bypass_context(bypass: threading.local) -> Callable[[], Any]:
    """The context manager class ``install`` returns: switches ``check_path`` off in this thread only."""

    class _Bypass:
        """Lets kernelexec's own runtime write its spill files under any profile."""

        def __enter__(self) -> None:
            bypass.on = True

        def __exit__(self, *exc: object) -> None:
            bypass.on = False

    return _Bypass


def deny_open_in(namespace: dict[str, Any], profile: str) -> None:
    """Replace ``open`` in a namespace for profiles with no file I/O (a clearer error than the audit hook)."""

    def open(file: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A001
        raise PolicyError(f"file access (open({file!r})) is not allowed in the {profile!r} profile")

    namespace["open"] = open

