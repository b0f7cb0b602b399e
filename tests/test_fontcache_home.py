"""The host-side font build never parses what a kernel could have planted (review finding 5): under trusted or
``--sandbox off`` a kernel runs as the server's user and can write ``~/.fonts``, ``~/.local/share/fonts`` or
``~/.config/fontconfig``; the build runs with its own empty HOME and XDG directories. And a build a SIGKILL cut
short leaves no ``.matplotlib-*`` directory behind for good (finding 6)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from pathlib import Path

import pytest

from kernelexec.environment import fontcache
from kernelexec.host import KernelReach


def test_fonts_planted_in_the_servers_home_are_never_scanned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or spec.origin is None:
        pytest.skip("matplotlib is not installed beside kernelexec")
    font = Path(spec.origin).parent / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
    home = tmp_path / "home"
    planted = [home / ".fonts", home / ".local" / "share" / "fonts", home / "xdg-data" / "fonts"]
    for number, where in enumerate(planted):
        where.mkdir(parents=True)
        shutil.copy(font, where / f"Planted{number}.ttf")  # a kernel's file: the server must not parse it
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "xdg-data"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    cache = tmp_path / "cache"
    cache.mkdir()
    stale, fresh = cache / ".matplotlib-killed", cache / ".matplotlib-building"
    stale.mkdir()
    fresh.mkdir()
    old = time.time() - 3600
    os.utime(stale, (old, old))
    reach = KernelReach(write_roots=(str(tmp_path / "work"),), read_roots=(str(tmp_path / "work"),), protected_bound=False)
    directory = fontcache.prepare(cache, reach)
    assert directory is not None
    listed = "".join(path.read_text() for path in fontcache.font_lists(directory))
    assert "DejaVuSans.ttf" in listed  # the list was built, from kernelexec's own and the system's fonts
    assert "Planted" not in listed and str(home) not in listed
    assert not stale.exists() and fresh.exists()  # a killed build's leftovers go; another server's build in progress stays
