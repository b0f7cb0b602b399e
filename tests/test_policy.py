"""Each profile's in-kernel layer: allowed and refused imports and file access, through MCP.

These guards give clear errors; they are not the security boundary (see docs/security.md).
"""

from __future__ import annotations

import contextlib
import importlib.util
import select
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kernelexec.sandbox.plan import GUARD_BLOCKED_MODULES
from kernelexec.sandbox.policy import CODE_MODE_MODULES, STRICT_IMPORTS, kernel_policy

from .conftest import Harness, make_settings, serving

pytestmark = [pytest.mark.anyio, pytest.mark.kernels_as_shipped]


@pytest.fixture(scope="module")
async def strict(short_tmp: Path) -> AsyncIterator[Harness]:
    async with serving(make_settings(short_tmp, profile="strict")) as h:
        yield h


@pytest.fixture(scope="module")
async def trusted(short_tmp: Path) -> AsyncIterator[Harness]:
    async with serving(make_settings(short_tmp, profile="trusted")) as h:
        yield h


def test_strict_allows_exactly_the_safe_executor_list_plus_four() -> None:
    policy = kernel_policy("strict", session_dir=Path("/s"), spill_dir=Path("/s/o"), work_roots=[], read_dirs=[],
                           allow_imports=[], result_cap=1, stream_cap=1, disk_cap=1)
    assert set(policy["allowed_imports"]) == STRICT_IMPORTS | CODE_MODE_MODULES  # and code mode's mcp_tools
    assert policy["file_io"] == "none" and policy["write_roots"] == []


# --- strict -----------------------------------------------------------------------------------

@pytest.mark.parametrize("module", sorted(STRICT_IMPORTS))
async def test_strict_allows_its_modules(strict: Harness, module: str) -> None:
    r = await strict.run(f"import {module}")
    assert r["success"], r["error"]


@pytest.mark.parametrize(
    "code",
    [
        "import os",
        "import sys",
        "import subprocess",
        "from os import path",
        "import os.path",
        "__import__('os')",
        "import importlib",
        "import socket",
        "import numpy",
        "import pathlib",
        "import io",
        "def f():\n    import os\nf()",
        "%reset -f\nimport os",
    ],
)
async def test_strict_refuses_other_imports_with_a_message_naming_them(strict: Harness, code: str) -> None:
    r = await strict.run(code)
    assert r["success"] is False
    assert r["error_type"] == "ImportError"
    assert "not allowed in the 'strict' profile" in r["error"]


@pytest.mark.parametrize(
    "code",
    [
        "open('x.txt', 'w')",
        "open('/etc/passwd').read()",
        "__builtins__.open('/etc/hostname').read()" ,
        "%reset -f\nopen('x.txt', 'w')",
    ],
)
async def test_strict_refuses_all_file_access(strict: Harness, code: str) -> None:
    r = await strict.run(code)
    assert r["success"] is False
    assert r["error_type"] == "PolicyError", r
    assert "strict" in r["error"]


async def test_strict_still_computes(strict: Harness) -> None:
    r = await strict.run("import math, statistics\nresult = [statistics.mean([1, 2, 3]), math.factorial(5)]")
    assert r["result"] == [2, 120]


# --- standard ---------------------------------------------------------------------------------

@pytest.mark.parametrize("module", ["os", "json", "pathlib", "numpy", "pandas", "matplotlib.pyplot", "tempfile", "collections.abc"])
async def test_standard_allows_stdlib_and_data_stack(harness: Harness, module: str) -> None:
    r = await harness.run(f"import {module}")
    assert r["success"], r["error"]


@pytest.mark.parametrize("code, expected", [
    ("import importlib.metadata\nresult = importlib.metadata.version('numpy').count('.') >= 1", True),
    ("import importlib.util\nresult = importlib.util.find_spec('pandas') is not None", True),
    ("import signal\nresult = int(signal.SIGINT)", 2),
    ("from comm import create_comm\nresult = callable(create_comm)", True),
    ("import sqlite3\ndb = sqlite3.connect(':memory:')\nresult = db.execute('select 40 + 2').fetchone()[0]", 42),
])
async def test_standard_allows_what_notebooks_use_and_the_os_layers_keep_inside(harness: Harness, code: str, expected: object) -> None:
    r = await harness.run(code)
    assert r["success"] and r["result"] == expected, r


@pytest.mark.parametrize("module", ["subprocess", "socket", "ctypes", "multiprocessing", "_posixsubprocess", "pty"])
async def test_standard_refuses_process_network_and_native_modules(harness: Harness, module: str) -> None:
    r = await harness.run(f"import {module}")
    assert r["error_type"] == "ImportError"
    assert f"Import of {module} is not allowed" in r["error"]


async def test_standard_imports_python_source_the_session_wrote_but_no_stdlib_name_nor_native_code(harness: Harness) -> None:
    """A notebook's own module in its working directory imports (as a project's code does); a file there named like
    a refused stdlib module does not unlock it, nor does a native extension module there."""
    s = await harness.new_session()
    r = await harness.run("open('kxown.py', 'w').write('X = 1')\nopen('pty.py', 'w').write('X = 2')\n"
                          "import importlib.machinery\nopen('kxnative' + importlib.machinery.EXTENSION_SUFFIXES[0], 'w').write('')\n"
                          "import kxown\nresult = kxown.X", session=s)
    assert r["success"] and r["result"] == 1, (r["error"], r["traceback"])
    for module in ("pty", "kxnative"):
        r = await harness.run(f"import {module}", session=s)
        assert r["error_type"] == "ImportError" and f"Import of {module} is not allowed" in r["error"], (r["error"], r["traceback"])


async def test_a_package_of_the_notebooks_own_code_imports_a_namespace_one_too(harness: Harness) -> None:
    """A folder of the notebook's modules with or without an ``__init__.py`` (a namespace package has no origin,
    only its folders), imported twice; kernelexec's own startup modules stay refused by their names."""
    s = await harness.new_session()
    r = await harness.run("import os\nos.makedirs('kxns', exist_ok=True)\nopen('kxns/m.py', 'w').write('Y = 2')\n"
                          "os.makedirs('kxpkg', exist_ok=True)\nopen('kxpkg/__init__.py', 'w').write('Z = 3')\n"
                          "import kxns.m, kxpkg\nresult = kxns.m.Y + kxpkg.Z", session=s)
    assert r["success"] and r["result"] == 5, (r["error"], r["traceback"])
    again = await harness.run("import kxns.m, kxpkg\nresult = kxns.m.Y + kxpkg.Z", session=s)
    assert again["success"] and again["result"] == 5, again["error"]
    refused = await harness.run("import _kernelexec_guard", session=s)
    assert refused["error_type"] == "ImportError" and "Import of _kernelexec_guard is not allowed" in refused["error"], refused


@pytest.mark.parametrize("module", [m for m in GUARD_BLOCKED_MODULES if importlib.util.find_spec(m) is not None])
async def test_guarded_kernels_cannot_import_the_sub_interpreter_and_test_modules(harness: Harness, strict: Harness,
                                                                                  module: str) -> None:
    """A sub-interpreter has none of the guard's audit hooks (3.13's _interpreters as 3.11's _xxsubinterpreters,
    and _testcapi.run_in_subinterp on every version): a plain import fails in every guarded profile (the module is
    on this server's Python, or it would not be a case). test_guard_bypass.py attacks past the import."""
    for h in (harness, strict):
        r = await h.run(f"import {module}")
        assert r["error_type"] in ("ImportError", "ModuleNotFoundError"), r


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.system('true')",
        "import os\nos.popen('true')",
        "import os\nos.execv('/bin/true', ['true'])",
        "import os\nos.fork()",
        "import os\nos.posix_spawn('/bin/true', ['true'], {})",
        "import os\nos.kill(os.getppid(), 0)",
        # the module object is reachable (sys.modules), but starting the process is not
        "import sys\nsys.modules['subprocess'].run(['true'])",
        # importlib is allowed (the OS layers keep it inside): a refused module through it still starts nothing
        "import importlib\nimportlib.__import__('subprocess').run(['true'])",
        "import signal, os\nos.kill(1, signal.SIGTERM)",
    ],
)
async def test_standard_refuses_processes_by_any_route(harness: Harness, code: str) -> None:
    r = await harness.run(code)
    assert r["success"] is False
    assert r["error_type"] == "PolicyError", r


@pytest.mark.parametrize(
    "code",
    [
        "open('/etc/passwd').read()",
        "import pathlib\npathlib.Path('/etc/hostname').read_text()",
        "import io\nio.open('/etc/passwd').read()",
        "import os\nos.open('/etc/passwd', os.O_RDONLY)",
        "import os\nos.listdir('/root')",
        "open('/tmp/kernelexec-escape.txt', 'w')",
        "import os\nos.symlink('/etc/passwd', 'link')\nopen('link').read()",
        "import shutil\nshutil.copyfile('/etc/passwd', 'copy')",
    ],
)
async def test_standard_refuses_files_outside_the_session(harness: Harness, code: str) -> None:
    r = await harness.run(code)
    assert r["success"] is False
    assert r["error_type"] == "PolicyError", r
    assert not Path("/tmp/kernelexec-escape.txt").exists()


async def test_standard_reads_and_writes_inside_the_session(harness: Harness) -> None:
    r = await harness.run(
        "import tempfile, pathlib\n"
        "pathlib.Path('data.csv').write_text('a,b\\n1,2\\n')\n"
        "import pandas as pd\n"
        "with tempfile.NamedTemporaryFile('w', suffix='.txt', delete=False) as fh:\n"
        "    fh.write('tmp')\n"
        "result = int(pd.read_csv('data.csv')['b'][0])"
    )
    assert r["success"], r["error"]
    assert r["result"] == 2


def _accepted(listener: socket.socket, window: float) -> list[str]:
    """Connections waiting on the listener (a connect that completed is in its backlog before the
    client's connect() returns), each with its first bytes."""
    got = []
    while select.select([listener], [], [], window)[0]:
        window = 0.0
        conn, peer = listener.accept()
        with conn:
            conn.settimeout(0.5)
            try:
                first = conn.recv(100)
            except OSError:
                first = b""
        got.append(f"{peer}: {first!r}")
    return got


@contextlib.contextmanager
def _listener() -> Iterator[socket.socket]:
    """A TCP listener on 127.0.0.1 that this test owns, proven to see a connection (the positive control)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        with socket.create_connection(listener.getsockname(), timeout=5) as probe:
            probe.sendall(b"control")
            assert [x for x in _accepted(listener, 5.0) if "b'control'" in x], "the listener does not see a connection"
        yield listener


async def test_standard_refuses_network(harness: Harness) -> None:
    with _listener() as listener:
        port = listener.getsockname()[1]
        r = await harness.run(f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/kxt-from-kernel', timeout=2)")
        assert r["success"] is False, r
        # the kernel's call has returned: a connection it made is in the backlog already (no window to wait for)
        assert _accepted(listener, 0.0) == [], f"the kernel reached a listener on the host: {r}"
        with socket.create_connection(listener.getsockname(), timeout=5) as probe:  # and the listener still listens
            probe.sendall(b"control")
            assert _accepted(listener, 5.0), "the listener stopped listening: its silence would prove nothing"
    assert "network access" in r["error"] or r["error_type"] == "URLError"


async def test_guard_survives_rebinding_builtins(harness: Harness) -> None:
    s = await harness.new_session()
    r = await harness.run("import builtins\nbuiltins.__import__ = __import__\nimport subprocess", session=s)
    assert r["error_type"] == "ImportError"
    r = await harness.run("import sys\nsys.modules['gc'].get_objects()", session=s)
    assert r["error_type"] == "PolicyError"


# --- trusted ----------------------------------------------------------------------------------

async def test_trusted_has_no_guards(trusted: Harness) -> None:
    r = await trusted.run("import subprocess\nresult = subprocess.run(['echo', 'hi'], capture_output=True, text=True).stdout")
    assert r["result"] == "hi\n"
    r = await trusted.run("import ctypes\nresult = ctypes.sizeof(ctypes.c_int)")
    assert r["result"] == 4


async def test_trusted_still_has_the_os_filesystem_view(trusted: Harness) -> None:
    """No in-kernel guard, but the OS layers keep the kernel to its directories (PermissionError, not PolicyError)."""
    from kernelexec.sandbox.probe import probe

    if not (probe().landlock_abi or probe().bwrap):
        pytest.fail("this machine has neither Landlock nor bubblewrap; the filesystem view cannot be enforced")
    r = await trusted.run("open('/etc/hostname').read()")
    assert r["error_type"] in ("PermissionError", "FileNotFoundError"), r
    r = await trusted.run("open('mine.txt', 'w').write('ok')")
    assert r["result"] == 2


async def test_server_secrets_do_not_reach_the_kernel(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel started *after* the secret was set (no pool, no spares: a pooled kernel started before it
    would pass with no scrubbing at all), in the trusted profile (no in-kernel guard)."""
    import os

    secret = f"hunter2-{os.getpid()}"
    monkeypatch.setenv("KERNELEXEC_TEST_SECRET", secret)
    async with serving(make_settings(short_tmp, profile="trusted", pool_size=0, restart_spares=0)) as h:
        r = await h.run("import os\nresult = {k: v for k, v in os.environ.items() if 'hunter2' in v}")
        assert r["result"] == {}, f"the server's environment reached the kernel: {r['result']}"
        r = await h.run("import os\nresult = 'KERNELEXEC_POLICY' in os.environ")
        assert r["result"] is False
    assert os.environ["KERNELEXEC_TEST_SECRET"] == secret  # the control: the server process had it all along
