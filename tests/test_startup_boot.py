"""``startup/kernel_init.py`` on its own: fails closed at every step and leaves no names behind.

Runs the boot file as ``exec_files`` does (the user namespace as its globals) in a subprocess with a
plain IPython shell, under the strict profile, so that an ``import`` after the guard would be refused.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernelexec.layout import startup_file
from kernelexec.sandbox.policy import kernel_policy

DRIVER = r"""
import builtins, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
ns = shell.user_ns
ns["__file__"] = sys.argv[1]
ns["get_ipython"] = lambda: shell
exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), ns)
import json
print(json.dumps([sorted(k for k in ns if "kernelexec" in k), sorted(k for k in vars(builtins) if k.startswith("_kernelexec"))]))
"""

STEPS = [node.name for node in ast.parse(startup_file("kernel_init.py").read_text()).body if isinstance(node, ast.FunctionDef)]


def boot(tmp_path: Path, fail_in: str | None) -> subprocess.CompletedProcess[str]:
    """Run a copy of the startup files, with ``raise RuntimeError`` first in the step ``fail_in`` (in the
    boot function itself: first in its ``try``, the fail-closed part)."""
    for name in ("guard", "runtime", "protected", "mcp_tools", "checkpoint", "kernel_init"):
        shutil.copy(startup_file(f"{name}.py"), tmp_path / f"{name}.py")
    init = tmp_path / "kernel_init.py"
    if fail_in is not None:
        tree = ast.parse(init.read_text())
        step = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fail_in)
        body = next(n for n in step.body if isinstance(n, ast.Try)).body if fail_in == "_kernelexec_boot" else step.body
        body.insert(0 if fail_in == "_kernelexec_boot" else 1, ast.parse("raise RuntimeError('injected')").body[0])  # after the docstring
        init.write_text(ast.unparse(tree))
    policy = kernel_policy("strict", session_dir=tmp_path, spill_dir=tmp_path / "o", work_roots=[], read_dirs=[],
                           allow_imports=[], result_cap=1, stream_cap=1, disk_cap=1)
    env = {**os.environ, "KERNELEXEC_POLICY": json.dumps(policy)}
    return subprocess.run([sys.executable, "-c", DRIVER, str(init)], env=env, capture_output=True, text=True, timeout=60)


def test_the_boot_leaves_only_its_builtins_and_imports_nothing_after_the_guard(tmp_path: Path) -> None:
    done = boot(tmp_path, None)
    assert done.returncode == 0, done.stderr  # under strict, an import in a step after the guard would end it (70)
    left, builtins = json.loads(done.stdout.splitlines()[-1])
    assert left == []
    assert builtins == ["_kernelexec_chdir", "_kernelexec_checkpoint_export", "_kernelexec_checkpoint_pause",
                        "_kernelexec_checkpoint_received",
                        "_kernelexec_checkpoint_reset", "_kernelexec_checkpoint_restore", "_kernelexec_checkpoint_resume",
                        "_kernelexec_checkpoint_status",
                        "_kernelexec_if", "_kernelexec_note", "_kernelexec_packages_added", "_kernelexec_policy",
                        "_kernelexec_refuse", "_kernelexec_report", "_kernelexec_star", "_kernelexec_tools_catalog", "_kernelexec_variables",
                        "_kernelexec_warm"]


@pytest.mark.parametrize("step", STEPS)
def test_an_exception_in_any_boot_step_ends_the_kernel_with_70(tmp_path: Path, step: str) -> None:
    done = boot(tmp_path, step)
    assert done.returncode == 70, (done.stdout, done.stderr)
    assert "kernelexec startup failed: RuntimeError('injected')" in done.stderr
