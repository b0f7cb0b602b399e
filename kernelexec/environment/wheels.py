"""Choosing and checking a wheel closure: nothing is built and no foreign interpreter runs on the host.

``pip install --only-binary :all:`` is not enough: that option covers what pip picks from an index,
not a wheel's direct-URL dependencies (``Requires-Dist: x @ file:///…`` or ``x @ https://…``), which
pip fetches and builds on the host — running their build backend, i.e. arbitrary code. Even
``pip install --dry-run --report -`` runs it, because the resolver needs a source requirement's
metadata (measured with pip 23.2 in tests/test_wheels.py: the in-tree backend of a ``file://``
directory or an ``http://`` sdist dependency writes its canary in a dry run too). And ``pip --python X`` re-executes pip under X with
``site`` on, which runs the project's ``.pth`` files and ``sitecustomize`` on the host.

So kernelexec resolves the closure itself (``resolve``), level by level, with its own pip asked only
for single wheels (``pip download --no-deps --only-binary :all:``, every requirement a plain name and
specifier, never a URL): each downloaded file must be a wheel; its ``METADATA`` is read here (zipfile
and the email parser), its ``Requires-Dist`` markers evaluated against the *target* interpreter's
markers, extras included (pip cannot do this for us: under ``--python-version`` it checks
``Requires-Python`` against the target, but evaluates dependency markers with ``marker.evaluate({"extra":
…})`` — ``req_install.match_markers``, ``metadata/importlib/_dists.iter_dependencies`` in pip 23.2 — so
``python_version`` and the rest are the running interpreter's); a requirement with a URL is refused before anything is
fetched for it. A later requirement that the version already chosen for a name does not satisfy
restarts the resolution with the combined specifier for that name (at most ``MAX_ROUNDS`` rounds).
Then exactly the chosen wheels are installed (``install``): ``pip install --no-deps --no-index
--require-hashes`` from a directory holding only them, each pinned ``name==version --hash=sha256:…``.

For another interpreter pip is told that interpreter's tags, so it is never run; the target, the
source and pip's command lines and environment are ``pip_commands.py``'s. Every pip runs in a fresh
empty directory (``Resolver.run``).
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from kernelexec.environment.pip_commands import Described, Source, Target, download_command, install_command, pip_env
from kernelexec.errors import KernelexecError
from kernelexec.host import empty_directory
from kernelexec.terminal import safe

MAX_ROUNDS = 8  # resolutions restarted with a narrower specifier before giving up on a conflict
MAX_WHEELS = 400  # a closure larger than this is refused (a dependency loop an index could serve)
_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
_UNREACHABLE = re.compile(r"Connection refused|Failed to establish a new connection|Name or service not known|timed out|"
                          r"Could not fetch URL|ConnectTimeout|Max retries exceeded|NewConnectionError|"
                          r"Temporary failure in name resolution", re.I)


def _key(name: str) -> str:
    """A project name as pip compares them (PEP 503)."""
    return str(canonicalize_name(name))


class WheelError(KernelexecError):
    """A closure refused, unavailable or conflicting, or pip failed. ``output`` is pip's text when pip
    failed; ``missing`` the requirement no wheel was found for, ``needed_by`` who asked for it."""

    def __init__(self, message: str, *, output: str | None = None, missing: str | None = None,
                 needed_by: str | None = None) -> None:
        super().__init__(message)
        self.output = output
        self.missing = missing
        self.needed_by = needed_by



@dataclass(frozen=True)
class Wheel:
    """A downloaded wheel, as its own METADATA describes it."""

    name: str  # as published (METADATA's Name)
    version: str
    path: Path
    sha256: str
    requires: tuple[str, ...]
    requires_python: str | None

    @property
    def key(self) -> str:
        return _key(self.name)

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


def read_wheel(path: Path) -> Wheel:
    """A wheel's METADATA, read from the archive (nothing in it runs); raises WheelError for anything else."""
    if not path.name.endswith(".whl"):
        raise WheelError(f"pip fetched {path.name}, which is not a wheel: refused (kernelexec never builds a package)")
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if len(names) != 1:
                raise WheelError(f"{path.name} has {len(names)} .dist-info/METADATA files: refused")
            text = archive.read(names[0]).decode("utf-8", errors="replace")
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelError(f"{path.name} is not a readable wheel: {exc}") from None
    meta = HeaderParser().parsestr(text)
    name, version = meta.get("Name"), meta.get("Version")
    if not name or not version:
        raise WheelError(f"{path.name}: its METADATA has no Name or Version: refused")
    if _key(path.name.split("-")[0]) != _key(name):
        raise WheelError(f"{path.name}: its METADATA names {name!r}, not the project in its file name: refused")
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return Wheel(str(name), str(version), path, digest.hexdigest(), tuple(str(r) for r in meta.get_all("Requires-Dist") or ()),
                 meta.get("Requires-Python"))


@dataclass
class _Wanted:
    specifier: SpecifierSet = field(default_factory=SpecifierSet)
    extras: set[str] = field(default_factory=set)
    why: list[str] = field(default_factory=list)
    specifiers: list[tuple[SpecifierSet, str]] = field(default_factory=list)  # each requirement's, with who asked


class _Narrow(Exception):  # noqa: N818 - control flow: restart the resolution with a narrower specifier
    def __init__(self, key: str, specifier: SpecifierSet) -> None:
        super().__init__(key)
        self.key, self.specifier = key, specifier


@dataclass
class Resolver:
    """The closure of ``specs`` for ``target`` from ``source``: one ``pip download`` per level (see the module)."""

    target: Target
    source: Source
    work: Path  # a fresh directory of the server's: downloads and pip's empty working directories go there
    deadline: float  # time.monotonic() by which everything must be done
    commands: list[list[str]] = field(default_factory=list)  # every pip command run, in order
    _fetched: dict[str, Wheel] = field(default_factory=dict)  # "name<specifier>" -> its wheel, across rounds
    _why: dict[str, list[str]] = field(default_factory=dict)  # name -> who asked for it (for messages)
    _calls: int = 0

    def resolve(self, specs: Sequence[str]) -> list[Wheel]:
        roots = []
        for spec in specs:
            try:
                roots.append(Requirement(spec))
            except InvalidRequirement as exc:
                raise WheelError(f"{spec!r} is not a requirement: {exc}") from None
        pins: dict[str, SpecifierSet] = {}
        for _ in range(MAX_ROUNDS):
            try:
                return self._round(roots, pins)
            except _Narrow as narrow:
                pins[narrow.key] = narrow.specifier
        raise WheelError(f"the versions of {', '.join(sorted(pins))} did not settle in {MAX_ROUNDS} rounds; "
                         "pin them (e.g. name==version)")

    def _round(self, roots: list[Requirement], pins: dict[str, SpecifierSet]) -> list[Wheel]:
        chosen: dict[str, Wheel] = {}
        wanted: dict[str, _Wanted] = {}
        expanded: dict[str, set[str]] = {}
        self._why = {}
        pending: list[tuple[Requirement, str]] = [(req, "asked for") for req in roots]
        while pending:
            fetch: list[str] = []
            for req, why in pending:
                self._refuse_reference(req, why)
                key = _key(req.name)
                want = wanted.setdefault(key, _Wanted())
                want.specifier &= req.specifier
                want.extras |= set(req.extras)
                want.why.append(f"{why} needs {req}" if why != "asked for" else f"{req} was asked for")
                if req.specifier:
                    want.specifiers.append((req.specifier, want.why[-1]))
                self._why[key] = want.why
                if key in chosen:
                    if not want.specifier.contains(chosen[key].version, prereleases=True):
                        if pins.get(key) == want.specifier & pins.get(key, SpecifierSet()):
                            raise self._conflict(key, want)  # already narrowed to this: it cannot be met
                        raise _Narrow(key, want.specifier & pins.get(key, SpecifierSet()))
                elif key not in fetch:
                    fetch.append(key)
            requests = {key: self._request(key, wanted[key], pins) for key in fetch}
            self._download({key: wanted[key] for key, request in requests.items() if request not in self._fetched}, pins)
            for key, request in requests.items():
                chosen[key] = self._fetched[request]
            if len(chosen) > MAX_WHEELS:
                raise WheelError(f"more than {MAX_WHEELS} distributions in the closure of {', '.join(map(str, roots))}: "
                                 "refused")
            pending = []
            for key, wheel in chosen.items():
                extras, done = wanted[key].extras, expanded.get(key)
                if done is not None and not extras - done:
                    continue
                pending += [(req, str(wheel)) for req in self._requirements(wheel, extras, done)]
                expanded[key] = set(extras)
        return sorted(chosen.values(), key=lambda w: w.key)

    def _requirements(self, wheel: Wheel, extras: set[str], done: set[str] | None) -> list[Requirement]:
        """What ``wheel`` requires on the target with ``extras``; only what the extras new since ``done`` add."""
        out = []
        for text in wheel.requires:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                raise WheelError(f"{wheel} has an unreadable requirement {text!r}: refused") from None
            if done is None:
                applies = self.target.evaluate(req, extras)
            else:
                applies = self.target.evaluate(req, extras) and not self.target.evaluate(req, done)
            if applies:
                out.append(req)
        return out

    def _refuse_reference(self, req: Requirement, why: str) -> None:
        if req.url is not None:
            who = "it was asked for" if why == "asked for" else f"{why} requires it"
            raise WheelError(f"{req.name}: {who} as a direct reference ({req.name} @ {req.url}), which pip would fetch "
                             "and build on the host, running its code: refused. kernelexec installs wheels from the "
                             "package index only, for every dependency")

    def _conflict_or_missing(self, key: str, want: _Wanted) -> None:
        """Nothing fits several requirements at once: a conflict when each alone has a wheel (raised here), else the
        requirement that has none (raised by pip's failure here)."""
        for specifier, why in want.specifiers:
            self._calls += 1
            dest = self.work / f"download-{self._calls}"
            dest.mkdir()
            try:
                self.run(download_command([f"{key}{specifier}"], dest, self.target, self.source))
            except WheelError as exc:
                if exc.missing is None:
                    raise
                exc.needed_by = why
                raise exc from None
        raise self._conflict(key, want)

    def _conflict(self, key: str, want: _Wanted) -> WheelError:
        return WheelError(f"no version of {key} satisfies every requirement ({'; '.join(want.why)}): the versions "
                          "conflict; pin compatible versions")

    @staticmethod
    def _request(key: str, want: _Wanted, pins: dict[str, SpecifierSet]) -> str:
        # the canonical name (letters, digits, "-") and specifiers: nothing pip could take for a path or URL
        return f"{key}{want.specifier & pins.get(key, SpecifierSet())}"

    def _download(self, wants: dict[str, _Wanted], pins: dict[str, SpecifierSet]) -> None:
        """One pip call for a level's new requirements; each file checked and read."""
        if not wants:
            return
        self._calls += 1
        dest = self.work / f"download-{self._calls}"
        dest.mkdir()
        requests = {key: self._request(key, want, pins) for key, want in wants.items()}
        try:
            output = self.run(download_command(list(requests.values()), dest, self.target, self.source))
        except WheelError as exc:
            if exc.missing is not None:
                key = _key(re.split(r"[<>=!~;\[ ]", exc.missing, maxsplit=1)[0])
                want = wants.get(key) or _Wanted(why=self._why.get(key, []))
                if key in pins or len({str(s) for s in want.specifiers}) > 1:
                    self._conflict_or_missing(key, want)
                exc.needed_by = "; ".join(want.why) or None
            raise
        got: dict[str, Wheel] = {}
        for path in sorted(dest.iterdir()):
            read = read_wheel(path)
            if read.key not in requests or read.key in got:
                raise WheelError(f"pip fetched {path.name}, which was not asked for: refused")
            got[read.key] = read
        for key, request in requests.items():
            wheel = got.get(key)
            if wheel is None:
                raise WheelError(f"pip fetched no wheel for {request}", output=output)
            self._check(wheel, wants[key], pins)
            self._fetched[request] = wheel

    def _check(self, wheel: Wheel, want: _Wanted, pins: dict[str, SpecifierSet]) -> None:
        try:
            version = Version(wheel.version)
        except InvalidVersion:
            raise WheelError(f"{wheel.path.name}: version {wheel.version!r} is not a valid version: refused") from None
        if not (want.specifier & pins.get(wheel.key, SpecifierSet())).contains(version, prereleases=True):
            raise WheelError(f"pip fetched {wheel} for {self._request(wheel.key, want, pins)}: refused")
        if wheel.requires_python:
            try:
                fits = SpecifierSet(wheel.requires_python).contains(self.target.python_version(), prereleases=True)
            except InvalidSpecifier:
                fits = True
            if not fits:
                raise WheelError(f"{wheel} requires Python {wheel.requires_python}, not {self.target.label}")

    def run(self, command: list[str]) -> str:
        """One pip, isolated, in a fresh empty directory; its output; WheelError when it fails."""
        self.commands.append(command)
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            with empty_directory() as empty:  # the server's own, outside every kernel's reach
                done = subprocess.run(command, cwd=empty, env=pip_env(), stdin=subprocess.DEVNULL, capture_output=True,
                                      text=True, errors="replace", timeout=remaining, check=False)
        except subprocess.TimeoutExpired:
            raise TimeoutError from None
        output = (done.stdout or "") + (done.stderr or "")
        if done.returncode != 0:
            tail = " | ".join(line.strip()[:200] for line in output.strip().splitlines()[-3:])
            if _UNREACHABLE.search(output):
                raise WheelError(f"the package index could not be reached: {tail}", output=output)
            match = _NO_MATCH.search(output)
            if match and command[4] == "download":
                missing = match.group(1).rstrip(".")
                raise WheelError(f"no wheel of {missing} for {self.target.label}", output=output, missing=missing)
            raise WheelError(f"pip failed: {tail}", output=output)
        return output


def install(specs: Sequence[str], staging: Path, target: Target, source: Source, *, timeout: float,
            work_parent: Path) -> tuple[list[Wheel], list[list[str]]]:
    """Resolve ``specs`` into checked wheels and install exactly those into ``staging``; (the wheels, the pip
    commands run). Raises WheelError (refused, unavailable, conflict, pip failed) or TimeoutError."""
    work = Path(tempfile.mkdtemp(prefix=".wheels-", dir=work_parent))
    try:
        resolver = Resolver(target, source, work, time.monotonic() + timeout)
        wheels = resolver.resolve(specs)
        picked = work / "picked"
        picked.mkdir()
        lines = []
        for wheel in wheels:
            try:
                os.link(wheel.path, picked / wheel.path.name)
            except OSError:
                shutil.copyfile(wheel.path, picked / wheel.path.name)
            lines.append(f"{wheel.name}=={wheel.version} --hash=sha256:{wheel.sha256}")
        requirements = work / "requirements.txt"
        requirements.write_text("\n".join(lines) + "\n")
        resolver.run(install_command(picked, requirements, staging, target, source))
        return wheels, resolver.commands
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class Interpreter:
    """An interpreter described by hand (``python -m kernelexec.environment.wheels``): what ``Target.of`` reads."""

    version_info: tuple[int, ...]
    tag: str
    machine: str
    libc: tuple[str, str] = ("", "")
    markers: tuple[tuple[str, str], ...] = ()
    own: bool = False


def command_line(requirements: Sequence[str], target_dir: Path, env: Described | None) -> list[str]:
    """The command that does what ``install`` does, to show a user: ``python -I -m kernelexec.environment.wheels ...``."""
    cmd = [sys.executable, "-I", "-m", "kernelexec.environment.wheels", "--target", str(target_dir)]
    if env is not None and not env.own:
        cmd += ["--python-version", ".".join(str(p) for p in env.version_info[:3]), "--tag", env.tag,
                "--machine", env.machine]
        if env.libc and env.libc[0] == "glibc":
            cmd += ["--glibc", env.libc[1]]
    return [*cmd, "--", *requirements]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -I -m kernelexec.environment.wheels --target DIR [--python-version 3.13.1 --tag cp313 --machine x86_64
    --glibc 2.36] REQUIREMENT...``: the closure, wheels only, for that interpreter (not run), into DIR."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kernelexec.environment.wheels", description=main.__doc__)
    parser.add_argument("--target", required=True, type=Path, help="a directory that does not exist yet")
    parser.add_argument("--python-version", help="the interpreter's full version, e.g. 3.13.1 (default: this one)")
    parser.add_argument("--tag", help="its tag with ABI flags, e.g. cp313 or cp313t")
    parser.add_argument("--machine", default=platform.machine())
    parser.add_argument("--glibc", default=None, help="its glibc version, e.g. 2.36 (default: this machine's)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("requirements", nargs="+")
    args = parser.parse_args(argv)
    env: Interpreter | None = None
    if args.python_version:
        version = tuple(int(p) for p in args.python_version.split(".")[:3])
        libc = ("glibc", args.glibc) if args.glibc else platform.libc_ver()
        env = Interpreter(version, args.tag or f"cp{version[0]}{version[1]}", args.machine, (libc[0], libc[1]))
    if args.target.exists():
        parser.error(f"{args.target} exists")
    args.target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{args.target.name}-", dir=args.target.parent))
    try:
        chosen, _ = install(args.requirements, staging, Target.of(env), Source(), timeout=args.timeout,
                            work_parent=args.target.parent)
    except (WheelError, TimeoutError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        print(safe(f"kernelexec.environment.wheels: {exc or 'timed out'}"), file=sys.stderr)
        return 1
    os.rename(staging, args.target)
    print(safe("installed " + ", ".join(str(w) for w in chosen) + f" into {args.target}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
