"""The first plot pays no font scan: matplotlib's font list is built once at server start-up into the cache
dir (environment/fontcache.py), read-only to every kernel, and a cache dir a kernel could write is never offered."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from .conftest import make_settings, serving
from .support import until

pytestmark = [pytest.mark.anyio, pytest.mark.kernels_as_shipped]

# the cell imports matplotlib itself (a session without warm imports) and says how matplotlib got its font list
IMPORT_AND_TELL = """\
import io, logging, os
_buf = io.StringIO()
_log = logging.getLogger("matplotlib.font_manager")
_log.addHandler(logging.StreamHandler(_buf))
_log.setLevel(logging.DEBUG)
import matplotlib, matplotlib.font_manager as fm
_path = os.path.join(matplotlib.get_cachedir(), f"fontlist-v{fm.FontManager.__version__}.json")
print(_buf.getvalue())
result = {"path": _path, "link": os.path.islink(_path), "target": os.path.realpath(_path)}
"""


def font_list(cache: Path) -> Path:
    built = sorted((cache / "matplotlib").glob("fontlist-v*.json"))
    assert len(built) == 1, built
    return built[0]


async def test_a_fresh_servers_first_session_imports_matplotlib_without_scanning_fonts(short_tmp: Path) -> None:
    cache = short_tmp / "fresh-cache"
    async with serving(make_settings(short_tmp, pool_size=0, warm_imports=[], cache_dir=cache)) as h:
        await until(lambda: list((cache / "matplotlib").glob("fontlist-v*.json")), "the font list prepared at start-up", 120)
        r = await h.run(IMPORT_AND_TELL)
        assert r["success"], r
        assert "Using fontManager instance from" in r["stdout"], r["stdout"]
        assert "generated new fontManager" not in r["stdout"] and "building the font cache" not in r["stdout"] + r["stderr"]
        assert r["result"]["link"] and r["result"]["target"] == str(font_list(cache).resolve()), r["result"]
        # a second session reads the same list (built once per install, not once per session)
        r2 = await h.run(IMPORT_AND_TELL, session=await h.new_session())
        assert r2["result"]["target"] == r["result"]["target"] and "generated new fontManager" not in r2["stdout"]


# each attempt prints one line: "<what> refused" or "<what> DONE"
ATTACK = """\
import os
_target = os.path.realpath(os.path.join(os.environ["MPLCONFIGDIR"], {name!r}))
_dir = os.path.dirname(_target)
print("target", _target)
def _try(what, fn):
    try:
        fn()
        print(what, "DONE")
    except OSError:
        print(what, "refused")
_try("append", lambda: open(_target, "a").write("x"))
_try("truncate", lambda: open(_target, "w").close())
_try("new file", lambda: open(os.path.join(_dir, "fontlist-v99.json"), "w").close())
_try("unlink", lambda: os.unlink(_target))
_try("rename over", lambda: os.rename(os.path.join(os.environ["MPLCONFIGDIR"], {name!r}), _target))
_try("chmod", lambda: os.chmod(_target, 0o666))
_try("mkdir", lambda: os.mkdir(os.path.join(_dir, "x")))
"""


@pytest.mark.parametrize("profile", ["trusted", "standard"])
async def test_a_kernel_cannot_change_the_prepared_font_list(short_tmp: Path, profile: str) -> None:
    """trusted: the OS layers alone (bubblewrap's read-only bind, Landlock, the kernel's own uid); standard: and the guard."""
    cache = short_tmp / f"cache-{profile}"
    async with serving(make_settings(short_tmp, pool_size=0, warm_imports=[], cache_dir=cache, profile=profile)) as h:
        await until(lambda: list((cache / "matplotlib").glob("fontlist-v*.json")), "the font list prepared at start-up", 120)
        listed = font_list(cache)
        before = hashlib.sha256(listed.read_bytes()).hexdigest()
        r = await h.run(ATTACK.format(name=listed.name))
        lines = r["stdout"].split("\n")
        assert f"target {listed.resolve()}" in lines, r["stdout"]  # the link the kernel was given, into the cache
        assert [line for line in lines if line.endswith("DONE")] == [], r["stdout"]
        assert len([line for line in lines if line.endswith("refused")]) == 7, r["stdout"]
        assert hashlib.sha256(listed.read_bytes()).hexdigest() == before
        assert sorted(p.name for p in listed.parent.iterdir()) == [listed.name]


async def test_a_cache_dir_kernels_can_write_is_never_offered(short_tmp: Path) -> None:
    """The cache dir inside a work root: a kernel plants a font list there; no session is offered it, and the
    server builds none there."""
    work = short_tmp / "work-root"
    work.mkdir()
    cache = work / "cache"
    async with serving(make_settings(short_tmp, pool_size=0, warm_imports=[], cache_dir=cache, work_roots=[work])) as h:
        planted = json.dumps({"_version": "planted", "ttflist": [], "afmlist": []})
        r = await h.run(f"import os\nos.makedirs({str(cache / 'matplotlib')!r}, exist_ok=True)\n"
                        f"open({str(cache / 'matplotlib' / 'fontlist-v3.11.0.json')!r}, 'w').write({planted!r})")
        assert r["success"], r
        r = await h.run(IMPORT_AND_TELL, session=await h.new_session())
        assert r["success"], r
        assert not r["result"]["link"], r["result"]
        assert str(cache) not in r["result"]["target"]
        assert "generated new fontManager" in r["stdout"]  # it scanned the fonts itself, as without a prepared list


async def test_a_new_installs_pooled_kernel_is_warmed_with_the_prepared_font_list(short_tmp: Path) -> None:
    """The list is built beside the pool's first kernel, not before it: a pooled kernel that booted before the list
    was there links it before its warm imports, so it never scans the fonts either."""
    cache = short_tmp / "pool-cache"
    async with serving(make_settings(short_tmp, pool_size=1, cache_dir=cache)) as h:
        await until(lambda: len(h.sessions.pool.sessions) == 1, "the pool filled and warmed", 180)
        r = await h.run(IMPORT_AND_TELL, session=await h.new_session())
        assert r["success"], r
        assert r["result"]["link"] and r["result"]["target"] == str(font_list(cache).resolve()), r["result"]
