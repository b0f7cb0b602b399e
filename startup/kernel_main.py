"""Kernel entry point used instead of ``ipykernel_launcher`` (stdlib + ipykernel only).

Before ipykernel is imported it blocks native-code modules the profile refuses (``ctypes`` would
otherwise be loaded by the kernel's own imports and left for user code to reach), and, under a
socket filter, keeps ipykernel's IOPub pipe from binding TCP (libzmq aborts if ``socket()`` fails).
Options come from ``KERNELEXEC_KERNEL`` (JSON), removed before user code runs.

The kernel's Python runs with ``-S``: ``site`` would import a ``sitecustomize`` from any
``sys.path`` entry, also one an editable install's ``.pth`` adds inside the (writable) project.
``setup_path`` does what ``site.main()`` does without that, defers every ``sys.path`` entry a
cell could write until the guard is installed (``startup/kernel_init.py`` appends them), and puts
kernelexec's ipykernel overlay, when the environment has no ipykernel, after the environment's
own site-packages, so the project's packages win. Runs on Python 3.10 and newer.
"""

import json
import os
import sys

BOOT_ONLY_BLOCKED = ("debugpy",)


def watch_lifeline(fd: int) -> None:
    """Exit when the server is gone. ``fd`` is the read end of a pipe whose write end only the server
    holds: it reads end-of-file once the server process has ended, however it ended (even SIGKILL, even
    in the instant before bubblewrap armed --die-with-parent while the kernel was being launched)."""
    import threading

    def wait() -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError:
            return  # closed by user code: the kernel then lives by --die-with-parent alone
        os._exit(0)

    threading.Thread(target=wait, name="kernelexec-lifeline", daemon=True).start()


def _under(path: str, roots: "list[str]") -> bool:
    real = os.path.realpath(path or ".")
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def setup_path(options: dict) -> None:
    import site

    try:
        known = site.removeduppaths()
        site.venv(known)  # 3.10 sets a venv's sys.prefix here, not at startup (it returns the same set)
        site.addsitepackages(known)
    except Exception:  # noqa: BLE001 - an interpreter whose site module differs: the dirs it told the server
        pass
    for directory in options.get("site_dirs", ()):
        if directory not in sys.path and os.path.isdir(directory):
            site.addsitedir(directory)
    for name in ("setquit", "setcopyright", "sethelper"):
        helper = getattr(site, name, None)
        if helper is not None:
            helper()
    writable = [os.path.realpath(p) for p in options.get("writable", ())]
    protected = [os.path.realpath(p) for p in options.get("protected", ())]
    late = [p for p in sys.path[1:] if _under(p, writable) and not _under(p, protected)]
    sys.path[:] = [p for i, p in enumerate(sys.path) if i == 0 or p not in late]
    overlay = options.get("overlay")
    if overlay:
        sys.path.append(overlay)
    os.environ["KERNELEXEC_LATE_PATH"] = json.dumps(late)


def main() -> None:
    options = json.loads(os.environ.pop("KERNELEXEC_KERNEL", "{}"))
    if sys.flags.no_site:
        setup_path(options)
    for name in options.get("block_modules", ()):
        sys.modules[name] = None  # type: ignore[assignment]  # `import ctypes` now raises ImportError
    # ipykernel imports debugpy (about 130 modules, 7 MB) for a debugger no client of kernelexec can reach (MCP
    # has no debug messages; Lab's guard refuses them): blocked while ipykernel starts, then, where the profile
    # allows it, importable again for a cell (startup/kernel_init.py lifts BOOT_ONLY_BLOCKED)
    lift = [name for name in BOOT_ONLY_BLOCKED if name not in sys.modules]
    for name in lift:
        sys.modules[name] = None  # type: ignore[assignment]
    os.environ["KERNELEXEC_LIFT_BLOCKED"] = json.dumps(lift)
    if os.getppid() == 1:
        # in a PID namespace our parent is its init: ipykernel's parent poller would exit at once;
        # bubblewrap's --die-with-parent and the lifeline below tie our lifetime to the server instead
        os.environ.pop("JPY_PARENT_PID", None)
    if options.get("deny_exec"):
        # The pre-exec wrapper needed one execve to start us; from here on nothing may replace the
        # kernel with another program (still single-threaded, so the filter covers every thread).
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_exec.py")
        spec = importlib.util.spec_from_file_location("_kernelexec_sandbox_exec", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"kernelexec: cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.deny_exec()
    lifeline = os.environ.pop("KERNELEXEC_LIFELINE", "")
    if lifeline.isdigit():  # the kernel's first thread: after the filter above, which then held the only thread
        watch_lifeline(int(lifeline))
    if options.get("no_iopub_pipe"):
        from ipykernel import iostream

        original = iostream.IOPubThread.__init__

        def no_pipe(self, socket, pipe=False, session=False):  # noqa: ARG001
            original(self, socket, pipe=False, session=session)

        iostream.IOPubThread.__init__ = no_pipe  # type: ignore[method-assign]  # on purpose: no pipe, whoever builds one
    from ipykernel.kernelapp import launch_new_instance

    launch_new_instance()


if __name__ == "__main__":
    main()
