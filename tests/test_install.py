"""The install path: build a wheel from a copy of the source, install it into a fresh venv, run it.

Tradeoff. A truly clean install resolves the dependencies (mcp, jupyter_client, ipykernel, pydantic,
...) from PyPI: about a minute, and the registry must be reachable. By default this test instead
makes a fresh venv *without* system site-packages, installs the wheel there with ``--no-deps``, and
lets the venv find the dependencies through a ``.pth`` line naming the test runner's own
site-packages. A plain path in a ``.pth`` file is not processed as a site directory, so the runner's
editable install of kernelexec does not load there: ``kernelexec`` comes from the wheel, and the
kernel runs the ``startup/`` files the wheel installed. That checks the packaging (modules,
``kernelexec/startup/*.py``, the console script, metadata) in seconds. Set
``KERNELEXEC_TEST_INSTALL_FROM_PYPI=1`` to install the dependencies from PyPI instead.

Building the wheel itself uses pip's isolated build, which fetches setuptools from PyPI (as
``pip install -e .`` in ``.ci/run`` does).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from .conftest import clean_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
FROM_PYPI = os.environ.get("KERNELEXEC_TEST_INSTALL_FROM_PYPI") == "1"
IGNORE = shutil.ignore_patterns(
    ".git", ".ci", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "node_modules", "*.pyc"
)


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{cmd}\nstdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the source tree (building in place would leave build/ in it)."""
    src = tmp_path_factory.mktemp("src") / "kernelexec"
    shutil.copytree(REPO, src, ignore=IGNORE)
    dist = tmp_path_factory.mktemp("dist")
    # -v: the build backend's own output, which -q hides, is what test_the_build_prints_no_warning reads
    proc = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-v", "-w", str(dist), str(src)])
    (dist / "build.log").write_text(proc.stdout + proc.stderr)
    (built,) = dist.glob("kernelexec-*.whl")
    return built


# what a verbose build prints that is not a warning about the project: pip's own index notes, and the
# backend saying that it skips byte-compiling (pip compiles at install)
BENIGN = ("byte-compiling is disabled", "is ignored: it is neither a file nor a directory")


def test_the_build_prints_no_warning(wheel: Path) -> None:
    """setuptools warns, for instance, when a folder that ships files (kernelexec/ui/) is not in `packages`:
    such a folder is left out of the wheel by a later setuptools, so the warning is a fault, not noise."""
    log = (wheel.parent / "build.log").read_text()
    assert "Successfully built" in log or "Saved" in log, log[-2000:]  # control: the log is the backend's, verbose
    warnings = [line.strip() for line in log.splitlines() if "warn" in line.lower() and not any(b in line for b in BENIGN)]
    assert warnings == [], "\n".join(warnings)


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed; returns its bin directory."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    if FROM_PYPI:
        run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", str(wheel)])
    else:
        run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps", str(wheel)])
        site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
        (site / "zz_kernelexec_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env_dir / "bin"


def test_the_wheel_carries_the_kernel_startup_files_and_the_console_script(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
        metadata = zf.read(f"{dist_info}/METADATA").decode()
    source = Path(__file__).resolve().parent.parent
    expected = {str(p.relative_to(source)) for p in (source / "kernelexec").rglob("*.py") if "__pycache__" not in p.parts}
    expected |= {f"kernelexec/startup/{p.name}" for p in (source / "startup").glob("*.py")}
    assert expected - names == set(), f"modules missing from the wheel (pyproject's packages list): {sorted(expected - names)}"
    assert "kernelexec/ui/run.html" in names
    assert "kernelexec = kernelexec.cli:main" in entry_points
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    for dependency in ("mcp", "jupyter_client", "ipykernel", "numpy", "pandas", "matplotlib"):  # the data stack by default
        assert any(line.split()[1].startswith(dependency) and "extra ==" not in line for line in requires), dependency


def test_the_installed_command_runs_code_from_the_installed_package(installed: Path, tmp_path: Path, short_tmp: Path) -> None:
    kernelexec = installed / "kernelexec"
    env = clean_env(PATH=f"{installed}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYTHONPATH", None)
    where = run([str(installed / "python"), "-c", "import kernelexec.kernel.launch as l; print(l.startup_script())"], env=env, cwd=tmp_path)
    startup = Path(where.stdout.strip())
    assert startup.name == "kernel_init.py" and startup.is_file()
    assert str(installed.parent) in str(startup), f"kernelexec was imported from {startup}, not from the wheel"
    state = short_tmp / "installed"  # kernel socket paths must stay short
    proc = run([str(kernelexec), "exec", "--state-dir", str(state), "result = 1 + 1"], env=env, cwd=tmp_path)
    answer = json.loads(proc.stdout)
    assert answer["success"] is True and answer["result"] == 2, answer
    assert answer["profile"] == "standard"
    # the hook subcommand is there too, and fast paths work from the installed command
    hook = subprocess.run([str(kernelexec), "hook", "pre-tool-use"], input="{}", capture_output=True, text=True,
                          timeout=60, env={**env, "KERNELEXEC_CODE_ONLY": "1"})
    assert json.loads(hook.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"


SEED_SORT = """\
import numpy as np
rng = np.random.default_rng(42)
numbers = rng.random(1_000_000)
ordered = np.sort(numbers)
print(f'sorted {ordered.size:,} numbers')
result = {'count': int(ordered.size), 'is_sorted': bool(np.all(ordered[:-1] <= ordered[1:])), 'min_first': bool(ordered[0] == numbers.min())}
"""

SEED_BINOMIAL = """\
import math
import matplotlib.pyplot as plt
n, p = 20, 0.5
ks = list(range(n + 1))
probs = [math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in ks]
fig, ax = plt.subplots()
ax.bar(ks, probs)
ax.set_title(f'Binomial distribution (n={n}, p={p})')
fig.savefig('binomial.svg')
result = round(sum(probs), 9)
"""


def test_the_seeds_examples_run_through_execute_code_on_the_installed_wheel(installed: Path, tmp_path: Path, short_tmp: Path) -> None:
    """The seeds' first two examples (numpy sorts a million numbers; a binomial bar chart as SVG) on a
    plain install: the installed ``kernelexec exec`` calls execute_code through a real MCP client."""
    kernelexec = installed / "kernelexec"
    env = clean_env(PATH=f"{installed}{os.pathsep}{os.environ.get('PATH', '')}")
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX"):
        env.pop(name, None)
    project = tmp_path / "work"
    project.mkdir()
    state = short_tmp / "seeds"
    sort = json.loads(run([str(kernelexec), "exec", "--state-dir", str(state), SEED_SORT], env=env, cwd=tmp_path).stdout)
    assert sort["success"], sort
    assert sort["stdout"] == "sorted 1,000,000 numbers\n"
    assert sort["result"] == {"count": 1_000_000, "is_sorted": True, "min_first": True}
    assert sort["environment"]["source"] == "own" and sort["environment"]["python"].startswith(str(installed))
    chart = json.loads(run([str(kernelexec), "exec", "--state-dir", str(state), "--working-dir", str(project), SEED_BINOMIAL],
                           env=env, cwd=tmp_path).stdout)
    assert chart["success"], chart
    assert chart["result"] == 1.0
    head = (project / "binomial.svg").read_text()[:2000]
    assert head.startswith("<?xml") and "<svg" in head
    assert {o["mime_type"] for o in chart["outputs"]} == {"image/png"}  # shown as Jupyter shows it
