"""The pip kernelexec runs: for which interpreter (``Target``), from where (``Source``), with which
command line and environment. Nothing here runs pip; ``wheels.py`` does, one wheel level at a time.

For another interpreter pip is told that interpreter's tags (``Target.of``: ``--python-version``,
``--implementation``, ``--abi``, ``--platform``), taken from what kernelexec already knows about it,
so it is never run. Every pip is ``sys.executable -I -m pip`` with an environment holding the
machine's pip configuration (its index, proxies, certificates) and no ``PYTHON*``/``KERNELEXEC_*``
variable (``pip_env``).
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import Version

# pip options that would change what is installed where, or run another interpreter: never taken from PIP_*
_DROPPED_PIP = {"PIP_TARGET", "PIP_PREFIX", "PIP_ROOT", "PIP_USER", "PIP_NO_BINARY", "PIP_PYTHON",
                "PIP_REQUIREMENT", "PIP_EDITABLE", "PIP_SRC", "PIP_PLATFORM", "PIP_PYTHON_VERSION", "PIP_IMPLEMENTATION",
                "PIP_ABI", "PIP_NO_BUILD_ISOLATION", "PIP_CONFIG_SETTINGS", "PIP_GLOBAL_OPTION", "PIP_BUILD_OPTION",
                "PIP_REQUIRE_HASHES", "PIP_NO_DEPS", "PIP_DEST", "PIP_REPORT", "PIP_UPGRADE", "PIP_FORCE_REINSTALL",
                "PIP_IGNORE_INSTALLED", "PIP_IGNORE_REQUIRES_PYTHON", "PIP_DRY_RUN"}
_KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTPS_PROXY",
         "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")


class Described(Protocol):
    """What ``Target.of`` reads of an interpreter: an ``interpreter.Environment``, or a ``wheels.Interpreter`` described by hand."""

    @property
    def own(self) -> bool: ...
    @property
    def version_info(self) -> tuple[int, ...]: ...
    @property
    def tag(self) -> str: ...
    @property
    def machine(self) -> str: ...
    @property
    def libc(self) -> tuple[str, str]: ...
    @property
    def markers(self) -> tuple[tuple[str, str], ...]: ...


@dataclass(frozen=True)
class Target:
    """The interpreter the wheels are for: its marker values, and pip's options naming its tags
    (none for kernelexec's own interpreter, whose tags pip knows)."""

    markers: tuple[tuple[str, str], ...]
    options: tuple[str, ...] = ()
    label: str = "kernelexec's own Python"

    @classmethod
    def own(cls) -> Target:
        return cls(tuple(sorted((k, str(v)) for k, v in default_environment().items())), (), f"Python {platform.python_version()} (kernelexec's own)")

    @classmethod
    def of(cls, env: Described | None) -> Target:
        """The target for ``env`` (an ``interpreter.Environment``); kernelexec's own when None or own."""
        if env is None or env.own:
            return cls.own()
        major, minor = env.version_info[0], env.version_info[1]
        full = ".".join(str(p) for p in env.version_info[:3])
        impl = env.tag[:2] or "cp"
        names = {"cp": ("cpython", "CPython"), "pp": ("pypy", "PyPy")}.get(impl, (impl, impl))
        markers = {"python_version": f"{major}.{minor}", "python_full_version": full, "implementation_name": names[0],
                   "implementation_version": full, "platform_python_implementation": names[1], "os_name": "posix",
                   "sys_platform": "linux", "platform_system": "Linux", "platform_machine": env.machine,
                   "platform_release": platform.release(), "platform_version": platform.version()}
        markers.update(dict(env.markers))  # what the interpreter said of itself wins
        options = ["--python-version", f"{major}.{minor}", "--implementation", impl]
        if impl == "cp":
            options += ["--abi", env.tag]  # with its ABI flags (cp313t); pip adds abi3 and none itself
        options += [item for platform_tag in platforms(env.machine, env.libc) for item in ("--platform", platform_tag)]
        return cls(tuple(sorted(markers.items())), tuple(options), f"Python {full} ({env.tag}, {env.machine})")

    def evaluate(self, requirement: Requirement, extras: Iterable[str]) -> bool:
        """Whether ``requirement`` applies to this target when ``extras`` were asked for ("" always is)."""
        if requirement.marker is None:
            return True
        base = dict(self.markers)
        return any(requirement.marker.evaluate({**base, "extra": extra}) for extra in ("", *extras))

    def python_version(self) -> Version:
        return Version(dict(self.markers).get("python_full_version") or platform.python_version())


def platforms(machine: str, libc: tuple[str, str]) -> list[str]:
    """pip ``--platform`` tags a Linux interpreter on ``machine`` with ``libc`` (("glibc", "2.36")) can load,
    newest first: manylinux_2_N down to 2_17 (2_5 on x86), the legacy aliases, linux_<arch>."""
    arch = re.sub(r"[^A-Za-z0-9]", "_", machine or platform.machine())
    kind, version = libc if libc and libc[0] else platform.libc_ver()
    tags = []
    match = re.match(r"(\d+)\.(\d+)", version or "") if kind == "glibc" else None
    if match and int(match.group(1)) == 2:
        floor = 5 if arch in ("x86_64", "i686") else 17
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        for minor in range(int(match.group(2)), floor - 1, -1):
            tags.append(f"manylinux_2_{minor}_{arch}")
            if minor in legacy and (minor == 17 or arch in ("x86_64", "i686")):
                tags.append(f"{legacy[minor]}_{arch}")
    tags.append(f"linux_{arch}")
    return tags


@dataclass(frozen=True)
class Source:
    """Where wheels come from: pip's configured index unless ``index_url``/``find_links`` say otherwise."""

    index_url: str | None = None
    find_links: str | None = None
    cache_dir: Path | None = None
    connect_timeout: float | None = None

    def options(self) -> list[str]:
        out = []
        if self.index_url:
            out += ["--index-url", self.index_url]
        if self.find_links:
            out += ["--find-links", str(self.find_links)]
            if not self.index_url:
                out += ["--no-index"]
        if self.cache_dir is not None:
            out += ["--cache-dir", str(self.cache_dir)]
        if self.connect_timeout is not None:
            out += ["--timeout", f"{self.connect_timeout:g}", "--retries", "0"]
        return out


def pip_env() -> dict[str, str]:
    """pip's environment: the machine's pip configuration stays (its index), nothing else of ours or the kernel's.
    ``_PIP_RUNNING_IN_SUBPROCESS`` makes pip ignore a ``python =`` line of a pip.conf (``pip --python``)."""
    env = {k: v for k, v in os.environ.items() if k in _KEPT or (k.startswith("PIP_") and k not in _DROPPED_PIP)}
    env["PIP_ONLY_BINARY"] = ":all:"
    env["_PIP_RUNNING_IN_SUBPROCESS"] = "1"
    return env


def pip(*args: str) -> list[str]:
    """kernelexec's own pip, isolated (-I: no cwd, no user site, no PYTHON* variables on its path)."""
    return [sys.executable, "-I", "-m", "pip", *args, "--no-input", "--disable-pip-version-check", "--progress-bar", "off"]


def download_command(requirements: Sequence[str], dest: Path, target: Target, source: Source) -> list[str]:
    """One level: the best wheel for each requirement (a name and specifiers), dependencies not followed."""
    return [*pip("download", "--no-deps", "--only-binary", ":all:", "--dest", str(dest), *target.options, *source.options()),
            "--", *requirements]


def install_command(picked: Path, requirements_file: Path, staging: Path, target: Target, source: Source) -> list[str]:
    """Exactly the checked wheels (hashes pinned), from a directory holding only them, into ``staging``."""
    cache = ["--cache-dir", str(source.cache_dir)] if source.cache_dir is not None else []
    return [*pip("install", "--no-deps", "--no-index", "--find-links", str(picked), "--require-hashes", "--only-binary",
                 ":all:", "--target", str(staging), "--no-compile", "--no-warn-script-location", *cache, *target.options,
                 "-r", str(requirements_file))]


__all__ = ["Source", "Target", "download_command", "install_command", "pip_env"]
