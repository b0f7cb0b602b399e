"""Kernel entry point used instead of ``ipykernel_launcher`` (stdlib + ipykernel only).

Before ipykernel is imported it blocks native-code modules the profile refuses (``ctypes`` would
otherwise be loaded by the kernel's own imports and left for user code to reach), and, under a
socket filter, keeps ipykernel's IOPub pipe from binding TCP (libzmq aborts if ``socket()`` fails).
Options come from ``KERNELEXEC_KERNEL`` (JSON), removed before user code runs.
"""

import json
import os
import sys


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


def main() -> None:
    options = json.loads(os.environ.pop("KERNELEXEC_KERNEL", "{}"))
    for name in options.get("block_modules", ()):
        sys.modules[name] = None  # type: ignore[assignment]  # `import ctypes` now raises ImportError
    if os.getppid() == 1:
        # in a PID namespace our parent is its init: ipykernel's parent poller would exit at once;
        # bubblewrap's --die-with-parent and the lifeline below tie our lifetime to the server instead
        os.environ.pop("JPY_PARENT_PID", None)
    lifeline = os.environ.pop("KERNELEXEC_LIFELINE", "")
    if lifeline.isdigit():
        watch_lifeline(int(lifeline))
    if options.get("deny_exec"):
        # The pre-exec wrapper needed one execve to start us; from here on nothing may replace the
        # kernel with another program (still single-threaded, so the filter covers every thread).
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_exec.py")
        spec = importlib.util.spec_from_file_location("_kernelexec_sandbox_exec", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.deny_exec()
    if options.get("no_iopub_pipe"):
        from ipykernel import iostream

        original = iostream.IOPubThread.__init__

        def no_pipe(self, socket, pipe=False, session=False):  # noqa: ARG001
            original(self, socket, pipe=False, session=session)

        iostream.IOPubThread.__init__ = no_pipe
    from ipykernel.kernelapp import launch_new_instance

    launch_new_instance()


if __name__ == "__main__":
    main()
