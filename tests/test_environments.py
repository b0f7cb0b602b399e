"""Kernels in the user's Python (the project's environment), with real interpreters (pyenv's 3.10, 3.12, 3.13 where
present; each test that needs one skips loudly without it), real kernels and real MCP clients.

The ipykernel overlay for an interpreter without ipykernel is built once per test session (from the
package index pip is configured with) into ``.pytest_cache`` when the cache plugin is on, else a
session temp dir; later sessions reuse it. ``overlay_cache`` asserts it was built.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from kernelexec.environment.discovery import resolve
from kernelexec.environment.interpreter import EnvironmentUnusable
from kernelexec.environment.overlay import overlay_path, overlay_ready, prepare

from .conftest import clean_env, kernelexec_cmd, make_settings, serving
from .support import pyenv_python

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.anyio, pytest.mark.kernels_as_shipped]


def need(minor: str) -> str:
    python = pyenv_python(minor)
    if python is None:
        pytest.skip(f"!!! NO PYTHON {minor} ON THIS MACHINE (pyenv versions): this test of real {minor} kernels did not run !!!")
    return python


def make_project(base: Path, python: str, name: str = "proj", *, pth_src: bool = False) -> Path:
    """A project: pyproject.toml, a .venv made by ``python -m venv`` (no pip, no ipykernel), a module
    installed in its site-packages, and (``pth_src``) an editable-style .pth naming the project's src/."""
    project = base / name
    project.mkdir()
    (project / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0"\n')
    subprocess.run([python, "-m", "venv", "--without-pip", str(project / ".venv")], check=True, timeout=120)
    (site,) = glob.glob(str(project / ".venv/lib/python3.*/site-packages"))
    (Path(site) / "projmod.py").write_text("import sys\nANSWER = 42\nWHERE = __file__\n")
    if pth_src:
        (project / "src" / "projsrc").mkdir(parents=True)
        (project / "src" / "projsrc" / "__init__.py").write_text("VALUE = 'from src'\n")
        (Path(site) / "_projsrc.pth").write_text(str(project / "src") + "\n")
    return project


def tree_hash(root: Path) -> str:
    """Every path, mode, symlink target and file content under ``root``."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            st = path.lstat()
            h.update(f"{path.relative_to(root)}|{st.st_mode:o}|{st.st_size}".encode())
            if path.is_symlink():
                h.update(os.readlink(path).encode())
            elif path.is_file():
                h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="session")
def built_312(overlay_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Python 3.12's overlay, built once (or found from an earlier session) and checked."""
    python = need("3.12")
    project = make_project(tmp_path_factory.mktemp("p312"), python)
    env = prepare("auto", project, overlay_cache)
    assert env.overlay and overlay_ready(Path(env.overlay)), env
    assert not (project / ".venv" / "lib" / "python3.12" / "site-packages" / "ipykernel").exists()
    return python


# --- resolution ------------------------------------------------------------------------------------------
def test_auto_prefers_the_working_dirs_venv_then_the_project_roots_then_virtual_env_then_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = need("3.12")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    project = make_project(tmp_path, python)
    sub = project / "pkg" / "deep"
    sub.mkdir(parents=True)
    env = resolve("auto", sub)  # below the project root: the root's .venv
    assert (env.source, env.version_info[:2], env.prefix) == ("project .venv", (3, 12), str(project / ".venv"))
    assert "project root" in env.reason
    subprocess.run([python, "-m", "venv", "--without-pip", str(sub / "venv")], check=True, timeout=120)
    assert resolve("auto", sub).prefix == str(sub / "venv")  # the working directory's own comes first
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert resolve("auto", elsewhere).source == "own"
    monkeypatch.setenv("VIRTUAL_ENV", str(project / ".venv"))
    assert (resolve("auto", elsewhere).source, resolve("auto", elsewhere).prefix) == ("VIRTUAL_ENV", str(project / ".venv"))
    monkeypatch.delenv("VIRTUAL_ENV")
    monkeypatch.setenv("CONDA_PREFIX", str(sub / "venv"))
    assert resolve("auto", elsewhere).source == "conda"
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    monkeypatch.delenv("CONDA_PREFIX")
    assert resolve("auto", None).source == "own"
    # --python as a prefix directory and as an executable
    assert resolve(str(project / ".venv"), None).source == "flag"
    assert resolve(python, None).python == python


@pytest.mark.parametrize("kind", ["missing", "directory", "not-executable", "not-python", "python-3.9", "hangs"])
def test_bad_python_is_refused_at_start_naming_the_path(kind: str, tmp_path: Path, short_tmp: Path) -> None:
    """``serve`` exits non-zero at once with one line naming the path: never a hang or a traceback."""
    path = {"missing": str(tmp_path / "nope" / "python"), "directory": str(tmp_path)}.get(kind)
    if kind == "not-executable":
        path = str(tmp_path / "python")
        Path(path).write_text("#!/bin/sh\necho hi\n")
    elif kind == "not-python":
        path = "/bin/true"
    elif kind == "python-3.9":
        path = pyenv_python("3.9") or pyenv_python("3.8")
        if path is None:
            pytest.skip("!!! NO PYTHON 3.9 or 3.8 ON THIS MACHINE: the too-old case did not run !!!")
    elif kind == "hangs":
        path = str(tmp_path / "python")
        Path(path).write_text("#!/bin/sh\nexec sleep 600\n")
        os.chmod(path, 0o755)
    env = clean_env()
    env.pop("VIRTUAL_ENV", None)
    if kind == "hangs":  # the inspection's bound, made short for the test (30 s by default)
        env["KERNELEXEC_INSPECT_TIMEOUT"] = "2"
    t0 = time.monotonic()
    proc = subprocess.run(kernelexec_cmd("serve", "--state-dir", str(short_tmp / f"bad-{kind}"), "--python", path),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env)
    assert proc.returncode != 0, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    assert path in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 60
    expected = {"missing": "no such file", "directory": "without bin/python", "not-executable": "not an executable",
                "not-python": "not a Python interpreter", "python-3.9": "kernels need Python 3.10 or newer",
                "hangs": "did not answer"}[kind]
    assert expected in proc.stderr, proc.stderr


def test_startup_files_compile_on_every_supported_python() -> None:
    """startup/ runs inside kernels of 3.10 and newer: stdlib only, no newer syntax."""
    ran = []
    for minor in ("3.10", "3.12", "3.13", "3.14"):
        python = pyenv_python(minor)
        if python is None:
            continue
        ran.append(minor)
        for path in sorted((REPO / "startup").glob("*.py")):
            proc = subprocess.run([python, "-c", "import ast,sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])", str(path)],
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, (minor, path.name, proc.stderr)
    if "3.10" not in ran:
        pytest.skip("!!! NO PYTHON 3.10 ON THIS MACHINE: the oldest supported version was not checked !!!")


# --- the project's .venv -------------------------------------------------------------------------------------
@pytest.mark.slow
async def test_a_project_venv_on_312_without_ipykernel_runs_the_kernel_and_stays_unchanged(
        built_312: str, overlay_cache: Path, short_tmp: Path, tmp_path: Path) -> None:
    project = make_project(tmp_path, built_312, pth_src=True)
    venv = project / ".venv"
    before = tree_hash(venv)
    (site,) = glob.glob(str(venv / "lib/python3.12/site-packages"))
    settings = make_settings(short_tmp, working_dir=project, cache_dir=overlay_cache, pool_size=1, restart_spares=0)
    async with serving(settings) as h:
        code = ("import sys, projmod, projsrc\n"
                "result = {'v': list(sys.version_info[:2]), 'answer': projmod.ANSWER, 'src': projsrc.VALUE,"
                " 'prefix': sys.prefix}")
        a = await h.run(code)
        assert a["success"], a
        assert a["result"] == {"v": [3, 12], "answer": 42, "src": "from src", "prefix": str(venv)}
        assert a["environment"]["source"] == "project .venv" and a["environment"]["version"].startswith("3.12")
        assert a["environment"]["python"].startswith(str(venv)) and a["environment"]["ipykernel"] == "kernelexec overlay"
        # a new session's first answer says where it runs
        header = (await h.call("execute_code", code="1", session=await h.new_session())).content[0].text.splitlines()[0]
        assert "python=3.12" in header and "(project .venv)" in header
        # the environment is read-only, also inside the writable working directory; the project is not
        planted = await h.run(
            "import os\nout = {}\n"
            f"for p in [{site + '/evil.pth'!r}, {site + '/sitecustomize.py'!r}, {str(venv / 'pyvenv.cfg')!r}, "
            f"{str(project / 'src' / 'sitecustomize.py')!r}, {str(project / 'notes.txt')!r}]:\n"
            "    try:\n"
            "        with open(p, 'a') as f: f.write('import os; open(os.environ.get(\"HOME\", \"/tmp\") + \"/PWNED\", \"w\")\\n')\n"
            "        out[p] = 'written'\n"
            "    except OSError as e:\n"
            "        out[p] = type(e).__name__\n"
            "result = out")
        assert planted["success"], planted
        result = planted["result"]
        assert result[site + "/evil.pth"] != "written" and result[site + "/sitecustomize.py"] != "written", result
        assert result[str(venv / "pyvenv.cfg")] != "written", result
        assert result[str(project / "notes.txt")] == "written", result  # the project itself stays writable
        assert result[str(project / "src" / "sitecustomize.py")] == "written", result  # on sys.path via the .pth
        # the next kernel does not run what the cell planted on its sys.path before the guard
        restarted = await h.call("restart_session")
        assert not restarted.is_error, restarted.content
        after = await h.run("import os, sys\nresult = [os.path.exists(os.path.expanduser('~/PWNED')), 'sitecustomize' in sys.modules]")
        assert after["result"] == [False, False], after
        # the notebook says where it ran
        nb = json.loads(Path(a["notebook"]).read_text())
        assert nb["metadata"]["language_info"]["version"].startswith("3.12")
        assert nb["metadata"]["kernelexec"]["environment"]["source"] == "project .venv"
    (project / "notes.txt").unlink()
    (project / "src" / "sitecustomize.py").unlink()
    assert tree_hash(venv) == before, "the project's .venv changed"


@pytest.mark.slow
async def test_python_flag_on_313_in_the_standard_profile(overlay_cache: Path, short_tmp: Path) -> None:
    python = need("3.13")
    settings = make_settings(short_tmp, python=python, cache_dir=overlay_cache, pool_size=0, restart_spares=0)
    async with serving(settings) as h:
        a = await h.run("import sys\nresult = list(sys.version_info[:2])")
        assert a["success"] and a["result"] == [3, 13], a
        assert a["environment"]["source"] == "flag" and a["environment"]["python"] == python
        refused = await h.run("import subprocess")  # the guard holds on 3.13 too
        assert not refused["success"] and "not allowed" in refused["error"], refused


@pytest.mark.slow
async def test_python_310_kernels_start_with_the_guard(overlay_cache: Path, short_tmp: Path) -> None:
    python = need("3.10")
    prefix = str(Path(python).parent.parent)  # --python as a prefix directory
    settings = make_settings(short_tmp, python=prefix, cache_dir=overlay_cache, pool_size=0, restart_spares=0)
    async with serving(settings) as h:
        a = await h.run("import sys, json\nresult = list(sys.version_info[:2])")
        assert a["success"] and a["result"] == [3, 10], a
        assert (await h.run("open('/etc/passwd').read()"))["success"] is False


async def test_a_pooled_kernel_of_another_environment_is_never_handed_out(
        built_312: str, overlay_cache: Path, short_tmp: Path, tmp_path: Path) -> None:
    project = tmp_path / "later"
    (project / "notebooks").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname='later'\nversion='0'\n")
    # kernels write in notebooks/; the project root's .venv, made later by the user, lies outside their reach
    # (one a kernel could have made is refused: tests/test_host_side.py)
    settings = make_settings(short_tmp, working_dir=project / "notebooks", cache_dir=overlay_cache, pool_size=1, restart_spares=0)
    async with serving(settings) as h:
        import anyio

        for _ in range(1200):
            if h.sessions.pool.sessions:
                break
            await anyio.sleep(0.1)
        assert h.sessions.pool.sessions, "the pool never filled"
        pooled = h.sessions.pool.sessions[0]
        assert pooled.environment.source == "own"
        # the project gets its .venv while the pool holds a kernel of kernelexec's own Python
        subprocess.run([built_312, "-m", "venv", "--without-pip", str(project / ".venv")], check=True, timeout=120)
        handle = await h.new_session()
        assert handle != pooled.handle
        a = await h.run("import sys\nresult = list(sys.version_info[:2])", session=handle)
        assert a["result"] == [3, 12] and a["environment"]["source"] == "project .venv", a
        assert pooled not in h.sessions.pool.sessions and pooled.kernel is None  # the stale one was stopped


def test_an_environment_pinning_what_ipykernel_cannot_live_with_is_refused_naming_both(
        built_312: str, overlay_cache: Path, tmp_path: Path, short_tmp: Path) -> None:
    project = make_project(tmp_path, built_312)
    (site,) = glob.glob(str(project / ".venv/lib/python3.12/site-packages"))
    info = Path(site) / "pyzmq-19.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pyzmq\nVersion: 19.0.0\n")
    (Path(site) / "zmq").mkdir()
    (Path(site) / "zmq" / "__init__.py").write_text("raise ImportError('an old pyzmq')\n")
    env = clean_env()
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(kernelexec_cmd("serve", "--working-dir", str(project), "--cache-dir", str(overlay_cache),
                                         "--state-dir", str(short_tmp / "pin")),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "pyzmq 19.0.0" in proc.stderr and "needs pyzmq" in proc.stderr, proc.stderr
    assert "jupyter_client" in proc.stderr or "ipykernel" in proc.stderr, proc.stderr


def test_offline_without_an_overlay_says_exactly_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = need("3.10")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no mirror, no find-links
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # and no index: offline
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    cache = tmp_path / "empty-cache"
    with pytest.raises(EnvironmentUnusable) as err:
        prepare(python, None, cache)
    message = str(err.value)
    target = str(overlay_path(resolve(python, None), cache))
    assert "could not fetch" in message and f"--target {target}" in message and "-m kernelexec.environment.wheels" in message, message
    assert "--python-version 3.10." in message and "--python " not in message, message  # its tags; it is never run
    assert not overlay_ready(Path(target))
    with pytest.raises(EnvironmentUnusable, match="run: "):
        prepare(python, None, cache, build=False)


def test_doctor_prints_the_resolution_and_why(built_312: str, overlay_cache: Path, tmp_path: Path) -> None:
    project = make_project(tmp_path, built_312)
    env = clean_env()
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(kernelexec_cmd("doctor", "--working-dir", str(project), "--cache-dir", str(overlay_cache)),
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"{project}/.venv/bin/python" in out and "Python 3.12" in out and "auto: .venv in the working directory" in out
    assert "kernelexec's overlay" in out and "(built)" in out


async def test_the_plugins_mcp_json_runs_kernels_in_the_projects_venv(
        built_312: str, overlay_cache: Path, tmp_path: Path, short_tmp: Path) -> None:
    """``.mcp.json``'s command line (serve --profile standard --working-dir .), started in a fixture
    project by a real stdio MCP client: the kernel runs in the project's .venv and imports its module."""
    project = make_project(tmp_path, built_312)
    config = json.loads((REPO / "plugins" / "kernelexec" / ".mcp.json").read_text())["mcpServers"]["kernelexec"]
    assert config["args"][-2:] == ["--working-dir", "."]
    env = clean_env(KERNELEXEC_CACHE_DIR=str(overlay_cache), KERNELEXEC_STATE_DIR=str(short_tmp / "plugin"))
    env.pop("VIRTUAL_ENV", None)
    cmd = kernelexec_cmd(*config["args"])
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=env, cwd=str(project))
    async with Client(params) as client:
        result = await client.call_tool("execute_code", {"code": "import sys, projmod\nresult = [list(sys.version_info[:2]), projmod.ANSWER]"})
        assert not result.is_error, result.content
        a = result.structured_content
        assert a["success"] and a["result"] == [[3, 12], 42], a
        assert a["profile"] == "standard" and a["environment"]["source"] == "project .venv"
        refused = (await client.call_tool("execute_code", {"code": "import subprocess"})).structured_content
        assert not refused["success"], refused


async def test_replay_uses_the_current_environment_and_says_it_differs(
        built_312: str, overlay_cache: Path, short_tmp: Path, tmp_path: Path) -> None:
    project = make_project(tmp_path, built_312)
    settings = make_settings(short_tmp, working_dir=project, cache_dir=overlay_cache, pool_size=0, restart_spares=0)
    async with serving(settings) as h:
        a = await h.run("import sys\nprint(sys.version_info[0])")
        assert a["success"], a
        notebook = a["notebook"]
    env = clean_env()
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(kernelexec_cmd("replay", notebook, "--state-dir", str(short_tmp / "rp"), "--cache-dir", str(overlay_cache)),
                          capture_output=True, text=True, timeout=180, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "note: recorded in Python 3.12" in proc.stdout and f"replayed in Python {sys.version.split()[0]}" in proc.stdout, proc.stdout


# --- warm kernels ------------------------------------------------------------------------------------------------
async def test_pooled_kernels_import_the_data_stack_ahead(short_tmp: Path) -> None:
    import anyio

    settings = make_settings(short_tmp, pool_size=1, restart_spares=0)
    async with serving(settings) as h:
        with anyio.fail_after(120):
            while not h.sessions.pool.sessions:
                await anyio.sleep(0.1)
        a = await h.run("import sys\nresult = sorted(m for m in ('numpy', 'pandas', 'matplotlib.pyplot') if m in sys.modules)")
        assert a["result"] == ["matplotlib.pyplot", "numpy", "pandas"], a
    cold = make_settings(short_tmp, pool_size=0, restart_spares=0)
    async with serving(cold) as h:  # a cold kernel pays nothing ahead
        a = await h.run("import sys\nresult = 'pandas' in sys.modules")
        assert a["result"] is False, a


async def test_without_bubblewrap_a_venv_inside_the_working_dir_is_said_writable_and_the_guard_refuses(
        built_312: str, overlay_cache: Path, short_tmp: Path, tmp_path: Path) -> None:
    """Landlock cannot take a right away from a subdirectory of a writable one: without bubblewrap ``auto``
    refuses a .venv kernels could write (naming the flag), and when the user names it with --python the
    plan says so (degraded), and in standard the guard refuses the write."""
    from kernelexec.sandbox.plan import plan_for
    from kernelexec.sandbox.probe import kernel_reach

    project = make_project(tmp_path, built_312)
    (site,) = glob.glob(str(project / ".venv/lib/python3.12/site-packages"))
    settings = make_settings(short_tmp, working_dir=project, cache_dir=overlay_cache, pool_size=0, restart_spares=0,
                             disable_layers=["bubblewrap"])
    with pytest.raises(EnvironmentUnusable, match=r"--python .*\.venv"):
        prepare("auto", project, overlay_cache, reach=kernel_reach(settings))
    settings = settings.model_copy(update={"python": str(project / ".venv")})
    env = prepare(settings.python, project, overlay_cache, reach=kernel_reach(settings))
    plan = plan_for(settings, "standard", session_dir=settings.sessions_dir / "x", rw=[project], ro=[], cwd=project, key="x",
                    environment=env)
    assert any("stays writable" in d for d in plan.degraded), plan.degraded
    async with serving(settings) as h:
        a = await h.run(f"open({site + '/evil.pth'!r}, 'w')")
        assert not a["success"] and "read-only" in a["error"], a
        assert "bubblewrap" not in a["layers"]
    assert not Path(site, "evil.pth").exists()


@pytest.mark.slow
async def test_a_cells_src_sitecustomize_never_runs_on_the_host_at_the_next_start_doctor_or_install(
        built_312: str, overlay_cache: Path, short_tmp: Path, tmp_path: Path) -> None:
    """An editable install's .pth puts the kernel-writable src/ on the project
    interpreter's path; a cell's src/sitecustomize.py ran on the host at the next inspection (the
    interpreter with site on), ipykernel probe or ``pip --python``. The judge: a canary in the test's own
    directory, which no kernel can reach."""
    from .support import build_wheel, package_index

    project = make_project(tmp_path, built_312, pth_src=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    canary = outside / "CANARY"
    (outside / "probe").write_text("writable from the host")  # positive control
    wheel = build_wheel(tmp_path / "wheels", "kxhost", "1.0", "VALUE = 1\n")
    with package_index(tmp_path / "index", [wheel]) as index:
        settings = make_settings(short_tmp, working_dir=project, cache_dir=overlay_cache, pool_size=0, restart_spares=0,
                                 index_url=index)
        async with serving(settings) as h:
            payload = f"open({str(canary)!r}, 'a').write('ran')\n"
            a = await h.run(f"open('src/sitecustomize.py', 'w').write({payload!r})\nresult = 'planted'")
            assert a["result"] == "planted", a
            installed = await h.call("install_packages", packages=["kxhost"])
            assert not installed.is_error, installed.content
            b = await h.run("import kxhost\nresult = kxhost.VALUE")
            assert b["result"] == 1, b
        assert not canary.exists(), "install_packages ran the project's interpreter with site on the host"
        out = subprocess.run(kernelexec_cmd("exec", "print(6 * 7)", "--working-dir", str(project), "--cache-dir", str(overlay_cache),
                                            "--state-dir", str(short_tmp / "s-sc"), "--pool-size", "0", "--restart-spares", "0"),
                             capture_output=True, text=True, timeout=300, cwd=project, env=clean_env())
        assert "42" in out.stdout, (out.stdout, out.stderr)
        doctor = subprocess.run(kernelexec_cmd("doctor", "--working-dir", str(project), "--cache-dir", str(overlay_cache),
                                               "--state-dir", str(short_tmp / "s-sd")),
                                capture_output=True, text=True, timeout=120, cwd=project, env=clean_env())
        assert ".venv in the working directory" in doctor.stdout, doctor.stdout
    assert not canary.exists(), canary.read_text()


def test_doctor_names_a_data_stack_installed_without_bytecode(tmp_path: Path) -> None:
    """Kernels never write bytecode: a package installed without .pyc (uv without --compile-bytecode) is compiled
    from source by every kernel that imports it, which doctor says; compiled, the note goes."""
    import compileall

    from kernelexec.environment.overlay import explain

    project = make_project(tmp_path, sys.executable)
    (site,) = glob.glob(str(project / ".venv/lib/python3.*/site-packages"))
    (Path(site) / "pandas").mkdir()
    (Path(site) / "pandas" / "__init__.py").write_text("VALUE = 1\n")
    lines = explain("auto", project, tmp_path / "cache")
    (pandas,) = [line for line in lines if line.strip().startswith("pandas ")]
    assert "no bytecode" in pandas, lines
    assert compileall.compile_dir(str(Path(site) / "pandas"), quiet=1)
    (pandas,) = [line for line in explain("auto", project, tmp_path / "cache") if line.strip().startswith("pandas ")]
    assert "no bytecode" not in pandas


def test_an_environments_installed_distributions_are_read_once_and_again_after_an_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each new_session resolves its environment; parsing every METADATA file of a data-stack venv took 0.3–0.9 s
    of it. The list is read again only when a site dir changed: an install shows at the next resolve."""
    from importlib import metadata

    project = make_project(tmp_path, sys.executable)
    (site,) = glob.glob(str(project / ".venv/lib/python3.*/site-packages"))
    reads: list[object] = []
    real = metadata.distributions
    monkeypatch.setattr(metadata, "distributions", lambda **kw: reads.append(kw) or real(**kw))
    first = resolve("auto", project)
    again = resolve("auto", project)
    assert first.distributions == again.distributions
    assert len(reads) == 1, "the metadata files were parsed again for an environment that did not change"
    info = Path(site) / "newpkg-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: newpkg\nVersion: 1.2\n")
    assert resolve("auto", project).version_of("newpkg") == "1.2"
    assert len(reads) == 2
