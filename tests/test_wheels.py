"""The wheel closure (kernelexec/wheels.py) against a real package index on 127.0.0.1.

Real parts only: wheels and sdists built here, served by a real HTTP server, resolved and installed
by kernelexec's own pip. The attack packages are wheels whose METADATA requires ``evil @ file:///…``
(a project directory) or ``evil @ http://127.0.0.1:…/evil-1.0.tar.gz`` (an sdist); evil's build
backend is in-tree (``backend-path``, no build requirements), so merely importing it — which pip does
to prepare its metadata — writes a canary file. The first tests show plain pip does exactly that on
the host (so the later ones can fail); the rest show kernelexec refuses before anything is built.
"""

from __future__ import annotations

import io
import os
import platform
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelexec.config import Settings
from kernelexec.environment import interpreter as environments
from kernelexec.environment import packages, pip_commands, wheels

from .support import build_sdist, build_wheel, package_index, pyenv_python

HOST_TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"
ARCH = platform.machine()
BACKEND = "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"


def in_tree_backend(canary: Path) -> dict[str, str]:
    """A project whose build backend writes ``canary`` when it is imported (no build requirements)."""
    return {"pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
            "backend.py": f"open({str(canary)!r}, 'a').write('evil build backend ran on the host\\n')\n" + BACKEND}


def evil_sdist(dest: Path, canary: Path) -> Path:
    path = dest / "evil-1.0.tar.gz"
    files = {**in_tree_backend(canary), "PKG-INFO": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n"}
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"evil-1.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


class Index:
    def __init__(self, url: str, base: Path, canaries: dict[str, Path]) -> None:
        self.url, self.base, self.canaries = url, base, canaries

    def clear(self) -> None:
        for canary in self.canaries.values():
            canary.unlink(missing_ok=True)

    def source(self) -> pip_commands.Source:
        return pip_commands.Source(index_url=self.url, cache_dir=self.base / "pip-cache", connect_timeout=10)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    base = tmp_path_factory.mktemp("wheels-index")
    canaries = {kind: base / f"canary-{kind}" for kind in ("file", "http", "sdist")}
    project = base / "evil-project"
    project.mkdir()
    for name, text in in_tree_backend(canaries["file"]).items():
        (project / name).write_text(text)
    w = base / "wheels"
    native = "VALUE = {!r}\n"
    files = [
        build_wheel(w, "kxfile", "1.0", "X = 1\n", requires=[f"evil @ {project.as_uri()}"]),
        build_wheel(w, "kxdep", "0.1", "DEP = '0.1'\n"),
        build_wheel(w, "kxdep", "0.2", "DEP = '0.2'\n"),
        build_wheel(w, "kxextra", "1.0", "EXTRA = True\n"),
        build_wheel(w, "kxmid", "1.0", "from kxdep import DEP\n", requires=["kxdep>=0.1", "kxextra; extra == 'more'"]),
        build_wheel(w, "kxtop", "1.0", "import kxmid\n", requires=["kxmid[more]>=1.0", "kxnever; python_version < '3'"]),
        build_wheel(w, "kxplain", "1.0", "", requires=["kxmid", "kxlate"]),
        build_wheel(w, "kxlate", "1.0", "", requires=["kxmid[more]"]),
        build_wheel(w, "kxc", "1.0", "C = 1\n"),
        build_wheel(w, "kxc", "2.0", "C = 2\n"),
        build_wheel(w, "kxa", "1.0", "", requires=["kxc>=1"]),
        build_wheel(w, "kxb", "1.0", "", requires=["kxc<2"]),
        build_wheel(w, "kxx", "1.0", "", requires=["kxc>=2"]),
        build_wheel(w, "kxneedsdist", "1.0", "", requires=["kxsdist>=1"]),
        build_sdist(base, "kxsdist", "1.0", f"open({str(canaries['sdist'])!r}, 'w').write('setup.py ran')\n"
                    "from setuptools import setup\nsetup(name='kxsdist', version='1.0')\n"),
        build_wheel(w, "kxmarked", "1.0", "", requires=["kxdep==0.1; python_version >= '3.12'",
                                                          "kxextra; python_version < '3.12'"]),
    ]
    for minor in ("3.11", "3.12", "3.13", f"{sys.version_info[0]}.{sys.version_info[1]}"):
        tag = f"cp{minor.replace('.', '')}"
        wheel = build_wheel(w / tag, "kxnative", "1.0", native.format(tag), tag=f"{tag}-{tag}-manylinux2014_{ARCH}")
        if wheel not in files:
            files.append(wheel)
    root = base / "root"
    with package_index(root, files) as url:
        # served once the port is known: a wheel requiring an sdist by URL on this same server
        evil_sdist(root, canaries["http"])
        port_url = url.rsplit("/", 1)[0]
        http = build_wheel(w / "http", "kxhttp", "1.0", "X = 1\n", requires=[f"evil @ {port_url}/evil-1.0.tar.gz"])
        (root / "simple" / "kxhttp").mkdir()
        (root / "simple" / "kxhttp" / http.name).write_bytes(http.read_bytes())
        (root / "simple" / "kxhttp" / "index.html").write_text(f'<a href="{http.name}">{http.name}</a>')
        yield Index(url, base, canaries)


@pytest.fixture(autouse=True)
def no_pip_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # only the test's index is asked
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)


def plain_pip(index: Index, target: Path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """What kernelexec ran before wheels.py: pip install --only-binary :all: --target."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    return subprocess.run([sys.executable, "-m", "pip", "install", "--only-binary", ":all:", "--target", str(target),
                           "--index-url", index.url, "--disable-pip-version-check", "--no-input", *extra, name],
                          capture_output=True, text=True, timeout=300, env=env, cwd=index.base)


def install(index: Index, specs: list[str], staging: Path, target: pip_commands.Target | None = None
            ) -> tuple[list[wheels.Wheel], list[list[str]]]:
    staging.mkdir(exist_ok=True)
    return wheels.install(specs, staging, target or pip_commands.Target.own(), index.source(), timeout=120,
                          work_parent=staging.parent)


# --- the attack ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dry_run", [False, True], ids=["install", "dry-run"])
@pytest.mark.parametrize("name", ["kxfile", "kxhttp"])
def test_plain_pip_only_binary_builds_a_direct_reference_dependency_on_the_host(
    index: Index, tmp_path: Path, name: str, dry_run: bool
) -> None:
    """The defect, measured: --only-binary :all: does not stop pip from building ``evil @ URL``, not even
    in a dry run (the resolver prepares its metadata by running its build backend)."""
    index.clear()
    canary = index.canaries["file" if name == "kxfile" else "http"]
    plain_pip(index, tmp_path / "target", name, *(["--dry-run", "--report", "-"] if dry_run else []))
    assert canary.exists(), "pip did not run the dependency's build backend: the attack below proves nothing"


@pytest.mark.parametrize("name, url", [("kxfile", "file://"), ("kxhttp", "http://127.0.0.1")])
def test_a_direct_reference_dependency_is_refused_before_anything_is_built(
    index: Index, tmp_path: Path, name: str, url: str
) -> None:
    index.clear()
    with pytest.raises(wheels.WheelError) as refused:
        install(index, [name], tmp_path / "staging")
    message = str(refused.value)
    assert f"{name} 1.0 requires it as a direct reference (evil @ {url}" in message, message
    assert "refused" in message and "build on the host" in message
    assert not any(c.exists() for c in index.canaries.values())
    assert list((tmp_path / "staging").iterdir()) == []
    # and through install_packages' installer: an InstallError with the same sentence
    settings = Settings(index_url=index.url, state_dir=tmp_path / "state", cache_dir=tmp_path / "cache")
    overlay = tmp_path / "session" / "packages"
    import anyio

    with pytest.raises(packages.InstallError, match=rf"{name} 1\.0 requires it as a direct reference"):
        anyio.run(lambda: packages.install(settings, [name], overlay))
    assert not any(c.exists() for c in index.canaries.values())
    assert list(overlay.iterdir()) == []


def test_a_direct_reference_asked_for_by_the_caller_is_refused(index: Index, tmp_path: Path) -> None:
    with pytest.raises(wheels.WheelError, match="it was asked for as a direct reference"):
        install(index, [f"evil @ {index.url.rsplit('/', 1)[0]}/evil-1.0.tar.gz"], tmp_path / "staging")
    assert not index.canaries["http"].exists()


def test_an_sdist_only_dependency_is_refused_and_never_built(index: Index, tmp_path: Path) -> None:
    index.clear()
    with pytest.raises(wheels.WheelError) as refused:
        install(index, ["kxneedsdist"], tmp_path / "staging")
    assert refused.value.missing == "kxsdist>=1" and "kxneedsdist 1.0 needs kxsdist>=1" in (refused.value.needed_by or "")
    settings = Settings(index_url=index.url, state_dir=tmp_path / "state", cache_dir=tmp_path / "cache")
    message = packages._failure(settings, ["kxneedsdist"], refused.value)
    assert message.startswith("no wheel of kxsdist>=1 (needed by: kxneedsdist 1.0 needs kxsdist>=1)"), message
    assert "wheels only" in message and "sdist" in message
    assert not index.canaries["sdist"].exists()


# --- ordinary closures ---------------------------------------------------------------------------
def test_a_dependency_chain_installs_with_extras_and_markers_each_wheel_pinned_by_hash(index: Index, tmp_path: Path) -> None:
    chosen, commands = install(index, ["kxtop"], tmp_path / "staging")
    assert {(w.name, w.version) for w in chosen} == {("kxtop", "1.0"), ("kxmid", "1.0"), ("kxdep", "0.2"), ("kxextra", "1.0")}
    installed = sorted(p.name for p in (tmp_path / "staging").iterdir())
    assert installed == ["kxdep", "kxdep-0.2.dist-info", "kxextra", "kxextra-1.0.dist-info", "kxmid", "kxmid-1.0.dist-info",
                         "kxtop", "kxtop-1.0.dist-info"]
    downloads = [c for c in commands if c[4] == "download"]
    assert [c[c.index("--") + 1:] for c in downloads] == [["kxtop"], ["kxmid>=1.0"], ["kxdep>=0.1", "kxextra"]]  # a level each
    last = commands[-1]
    assert last[4] == "install" and {"--no-deps", "--no-index", "--require-hashes", "--target"} <= set(last)
    for command in commands:
        assert command[:4] == [sys.executable, "-I", "-m", "pip"] and "--python" not in command
        assert "--only-binary" in command
    check = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import kxtop, kxmid, "
                            "kxextra; print(kxmid.DEP)", str(tmp_path / "staging")], capture_output=True, text=True)
    assert check.stdout.strip() == "0.2", check.stderr


def test_an_extra_asked_for_later_adds_its_requirements(index: Index, tmp_path: Path) -> None:
    """kxmid is chosen without extras first; kxlate, a level later, asks for kxmid[more]: kxextra joins."""
    chosen, _ = install(index, ["kxplain"], tmp_path / "staging")
    assert {w.name for w in chosen} == {"kxplain", "kxmid", "kxlate", "kxdep", "kxextra"}


def test_a_later_narrower_requirement_picks_an_older_version(index: Index, tmp_path: Path) -> None:
    """kxa takes kxc 2.0 first; kxb needs kxc<2: the resolution starts again with kxc>=1,<2."""
    chosen, _ = install(index, ["kxa", "kxb"], tmp_path / "staging")
    assert {(w.name, w.version) for w in chosen} == {("kxa", "1.0"), ("kxb", "1.0"), ("kxc", "1.0")}


def test_requirements_no_version_can_meet_fail_naming_both(index: Index, tmp_path: Path) -> None:
    with pytest.raises(wheels.WheelError) as conflict:
        install(index, ["kxx", "kxb"], tmp_path / "staging")
    message = str(conflict.value)
    assert message.startswith("no version of kxc satisfies every requirement"), message
    assert "kxx 1.0 needs kxc>=2" in message and "kxb 1.0 needs kxc<2" in message, message


def test_pips_environment_keeps_the_machine_configuration_and_nothing_of_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"PIP_INDEX_URL": "http://mirror/simple", "HTTPS_PROXY": "http://proxy:3128", "PIP_PYTHON": "/x",
                        "PYTHONPATH": "/planted", "PYTHONSTARTUP": "/planted.py", "KERNELEXEC_TOKEN": "t",
                        "PIP_CONSTRAINT": "/c.txt", "PIP_NO_BINARY": ":all:"}.items():
        monkeypatch.setenv(name, value)
    env = pip_commands.pip_env()
    assert env["PIP_INDEX_URL"] == "http://mirror/simple" and env["HTTPS_PROXY"] == "http://proxy:3128"
    assert not [k for k in env if k.startswith(("PYTHON", "KERNELEXEC_"))]
    assert "PIP_PYTHON" not in env and "PIP_NO_BINARY" not in env
    assert env["PIP_CONSTRAINT"] == "/c.txt"  # the machine's constraints stay (pip refuses links in them)
    assert env["PIP_ONLY_BINARY"] == ":all:" and env["_PIP_RUNNING_IN_SUBPROCESS"] == "1"


def test_platform_tags_follow_the_glibc_and_the_machine() -> None:
    x86 = pip_commands.platforms("x86_64", ("glibc", "2.36"))
    assert x86[0] == "manylinux_2_36_x86_64" and x86[-1] == "linux_x86_64"
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"} <= set(x86)
    arm = pip_commands.platforms("aarch64", ("glibc", "2.28"))
    assert arm[0] == "manylinux_2_28_aarch64" and "manylinux2014_aarch64" in arm and "manylinux_2_16_aarch64" not in arm
    assert "manylinux1_aarch64" not in arm


# --- another interpreter, never run ----------------------------------------------------------------
class Audit:
    """Every process this test process starts, from CPython's own audit events (PEP 578)."""

    active: list[tuple[str, list[str]]] | None = None
    installed = False

    def __enter__(self) -> list[tuple[str, list[str]]]:
        if not Audit.installed:
            sys.addaudithook(Audit.hook)
            Audit.installed = True
        Audit.active = []
        return Audit.active

    def __exit__(self, *exc: object) -> None:
        Audit.active = None

    @staticmethod
    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "subprocess.Popen" and Audit.active is not None:
            argv = [os.fsdecode(a) for a in args[1]]
            Audit.active.append((os.fsdecode(args[0]) if args[0] else argv[0], argv))


@pytest.mark.slow
@pytest.mark.parametrize("minor", ["3.12", "3.13"])
def test_wheels_for_another_interpreter_are_chosen_without_running_it(
    index: Index, tmp_path: Path, minor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A venv of that Python whose site-packages has a .pth writing a canary: were it run with ``site`` (as
    ``pip --python`` does, here even asked for through PIP_PYTHON), the canary would appear."""
    python = pyenv_python(minor)
    if python is None:
        pytest.skip(f"!!! NO PYTHON {minor} ON THIS MACHINE (pyenv versions): this test did not run !!!")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    env = environments.inspect(str(venv / "bin" / "python"), "flag", "test")  # inspection runs it; before the .pth
    assert not env.own and env.tag == f"cp{minor.replace('.', '')}"
    canary = tmp_path / "ran"
    (Path(env.site_packages[0]) / "zz_canary.pth").write_text(f"import os; open({str(canary)!r}, 'w').close()\n")
    monkeypatch.setenv("PIP_PYTHON", env.python)
    with Audit() as started:
        chosen, commands = install(index, ["kxnative", "kxmarked"], tmp_path / "staging", pip_commands.Target.of(env))
    assert not canary.exists(), "the other interpreter was run with site on"
    assert started and all(exe == sys.executable and argv[1:4] == ["-I", "-m", "pip"] for exe, argv in started), started
    assert not [argv for _, argv in started if "--python" in argv or any(venv.name in a and str(venv) in a for a in argv)]
    assert [argv for _, argv in started] == commands
    assert "--python-version" in commands[0] and f"cp{minor.replace('.', '')}" in commands[0]
    # the markers were the target's: 3.12 and 3.13 take kxdep==0.1, this interpreter (3.11) would take kxextra
    assert {(w.name, w.version) for w in chosen} == {("kxnative", "1.0"), ("kxmarked", "1.0"), ("kxdep", "0.1")}
    assert next(w for w in chosen if w.name == "kxnative").path.name.startswith(f"kxnative-1.0-{env.tag}-{env.tag}-")
    check = subprocess.run([python, "-I", "-S", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import kxnative; "
                            "print(kxnative.VALUE)", str(tmp_path / "staging")], capture_output=True, text=True, timeout=60)
    assert check.stdout.strip() == env.tag, check.stderr


def test_the_command_shown_to_users_does_the_same_for_that_interpreter(index: Index, tmp_path: Path) -> None:
    described = wheels.Interpreter((3, 13, 0), "cp313", ARCH, ("glibc", platform.libc_ver()[1]))
    command = wheels.command_line(["kxnative"], tmp_path / "overlay", described)
    assert command[:4] == [sys.executable, "-I", "-m", "kernelexec.environment.wheels"] and "--python" not in command
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))} | {
        "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": index.url}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "overlay" / "kxnative" / "__init__.py").read_text() == "VALUE = 'cp313'\n"
