"""kernelexec's startup code for a kernel that does not run on this machine's files.

A kernel on a gateway (``gateway.py``) or launched by a remote provisioner (``kernelspecs.py``)
cannot run ``startup/kernel_init.py`` through ``exec_files``: the file is not there. So one silent
execute carries the policy and the source of the startup files (``startup/guard.py``, ``runtime.py``,
``protected.py``, ``mcp_tools.py``, ``checkpoint.py``, ``kernel_init.py``); the kernel writes them to ``<its temp dir>/kernelexec-<handle>.startup/``
and runs them exactly as a local kernel does (same builtins, same guard, same fail-closed
``os._exit``). Paths in the policy are the remote kernel's: its session directory is
``<its temp dir>/kernelexec-<handle>``, and files the kernel itself spills live there.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from kernelexec.errors import KernelDied, KernelStartError
from kernelexec.layout import startup_file
from kernelexec.sandbox import policy as policy_module

if TYPE_CHECKING:
    from kernelexec.kernel.driver import Kernel

_REMOTE_BOOT = '''
def _kernelexec_remote_boot(args):
    import json, os, site, sys, sysconfig, tempfile
    args = json.loads(args)
    root = os.path.join(tempfile.gettempdir(), "kernelexec-" + args["handle"])
    for d in ("", "work", "spill", "home", "tmp", "checkpoint"):
        os.makedirs(os.path.join(root, d), mode=0o700, exist_ok=True)
    if os.stat(root).st_uid != os.getuid():
        raise PermissionError("kernelexec: " + root + " belongs to another user")
    # what a local kernel gets from its launch environment (LaunchSpec.environment)
    os.environ.update(HOME=os.path.join(root, "home"), TMPDIR=os.path.join(root, "tmp"),
                      MPLCONFIGDIR=os.path.join(root, "home", ".matplotlib"), PYTHONDONTWRITEBYTECODE="1")
    tempfile.tempdir = None  # kernel_init caches the new TMPDIR
    sys.dont_write_bytecode = True
    roots_ns = {"os": os, "site": site, "sys": sys, "sysconfig": sysconfig}
    exec(args["python_read_roots"], roots_ns)

    def expand(paths):
        out = []
        for p in paths:
            out.extend([root] if p == "<session>" else roots_ns["python_read_roots"]() if p == "<python>" else [p])
        return out

    policy = args["policy"]
    policy["spill_dir"] = os.path.join(root, "spill")
    policy["checkpoint_dir"] = os.path.join(root, "checkpoint")
    for key in ("write_roots", "read_roots", "installed_roots"):
        if key in policy:
            policy[key] = expand(policy[key])
    # the startup files go next to the session directory, outside every root the policy allows, and
    # stay there (once the guard is installed, removing them would be refused like any other write)
    boot = root + ".startup"
    os.makedirs(boot, mode=0o700, exist_ok=True)
    if os.stat(boot).st_uid != os.getuid():
        raise PermissionError("kernelexec: " + boot + " belongs to another user")
    for name, text in args["sources"].items():
        with open(os.path.join(boot, name + ".py"), "w", encoding="utf-8") as fh:
            fh.write(text)
    os.chdir(os.path.join(root, "work"))
    os.environ["KERNELEXEC_POLICY"] = json.dumps(policy)
    init = os.path.join(boot, "kernel_init.py")
    code = compile(args["sources"]["kernel_init"], init, "exec")
    exec(code, {"__name__": "_kernelexec_init", "__file__": init, "__builtins__": __builtins__,
                "get_ipython": get_ipython})
    # Locally kernel_init runs outside any cell. Here it runs inside one, and IPython's output tee
    # (InteractiveShell._tee) puts back each stream's write method when a cell ends, undoing the
    # stream cap. So the cap is put on again before each cell whenever it has been undone.
    import builtins
    runtime = builtins._kernelexec_report.__self__
    streams = [s for s in (sys.stdout, sys.stderr) if hasattr(s, "pub_thread")]
    capped = {s.name: s.write for s in streams}

    def recap(info):
        for stream in streams:
            if stream.write is not capped[stream.name]:
                runtime.cap_stream(stream)
                capped[stream.name] = stream.write

    get_ipython().events.register("pre_run_cell", recap)
    return root


_kernelexec_remote_root = _kernelexec_remote_boot(__ARGS__)
del _kernelexec_remote_boot
'''


def remote_spill_ok(path: Any, handle: str) -> bool:
    """A spill file a remote kernel reports: in its own ``<tmp>/kernelexec-<handle>/spill/`` (see the boot code)."""
    if not isinstance(path, str) or not os.path.isabs(path):
        return False
    parent = PurePosixPath(path).parent
    return parent.name == "spill" and parent.parent.name == f"kernelexec-{handle}"


def remote_policy(policy: dict[str, Any]) -> dict[str, Any]:
    """The session's policy with the server's paths taken out: the remote kernel puts its own session
    directory (``<session>``) and its own Python's library paths (``<python>``) in their place. The
    server's ``--work-roots`` and ``--read-dirs`` do not exist there and are left out."""
    remote = {k: v for k, v in policy.items() if k not in ("spill_dir", "packages_dir", "checkpoint_dir")}
    if "write_roots" in remote:
        remote["write_roots"] = ["<session>"] if remote["write_roots"] else []
    if "read_roots" in remote:
        remote["read_roots"] = ["<python>"]
    if "installed_roots" in remote:  # the guard's installed code (never a notebook's own module): the remote Python's
        remote["installed_roots"] = ["<python>"]
    return remote


def startup_code(policy: dict[str, Any], handle: str) -> str:
    """The one silent cell that installs kernelexec's startup code in a kernel that lacks our files."""
    sources = {name: startup_file(f"{name}.py").read_text(encoding="utf-8") for name in ("guard", "runtime", "protected", "mcp_tools",
                                                                                     "checkpoint", "kernel_init")}
    args = {
        "handle": handle,
        "policy": remote_policy(policy),
        "sources": sources,
        "python_read_roots": inspect.getsource(policy_module.python_read_roots),
    }
    return _REMOTE_BOOT.replace("__ARGS__", repr(json.dumps(args)))


async def install_remote_startup(kernel: Kernel) -> None:
    """Run the startup code in ``kernel`` (started, channels open) as one silent execute and wait for
    its reply; raise ``KernelStartError`` if it fails, times out or the kernel dies (fail closed)."""
    msg_id = kernel.kc.execute(startup_code(kernel.spec.policy, kernel.spec.dirs.root.name), silent=True,
                               store_history=False, allow_stdin=False)
    try:
        reply = await kernel.reply_to(msg_id, kernel.startup_timeout)
    except TimeoutError:
        raise KernelStartError("the remote kernel did not answer the startup code in time", kernel.log_tail()) from None
    except KernelDied as exc:
        raise KernelStartError(f"the remote kernel died running kernelexec's startup code ({exc})", kernel.log_tail()) from None
    content = reply.get("content")
    if not isinstance(content, dict) or content.get("status") != "ok":
        content = content if isinstance(content, dict) else {}
        raise KernelStartError(
            f"kernelexec's startup code failed in the remote kernel: {content.get('ename')}: {content.get('evalue')}",
            kernel.log_tail())
