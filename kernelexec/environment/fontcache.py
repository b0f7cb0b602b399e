"""matplotlib's font list, built once per install at server start-up, read-only to every kernel.

matplotlib scans the machine's fonts (about 0.6 s) the first time it is imported with an empty cache
directory, and writes ``fontlist-v<version>.json`` there. A kernel's ``MPLCONFIGDIR`` is in its session's
own (new, writable) home, so every new kernel paid that scan: in the user's first cell, or in each warm
kernel's warm-up. ``prepare`` builds the list once into ``<cache dir>/matplotlib`` by running kernelexec's
own interpreter isolated (``host.run_python``: ``-I``, from an empty directory) — it never runs a file a
kernel could write, and the server never reads the list back. ``ready`` offers that directory to kernels
only while no kernel can write it; each kernel links the file into its own ``MPLCONFIGDIR`` at start
(``startup/kernel_init.py``): a kernel whose matplotlib has another font-list version finds no file of its
name there and builds its own, as before. The fonts the list names lie in kernelexec's own environment
and the system's directories, which every kernel reads (``sandbox/probe.system_read_paths``). The build runs
with ``HOME`` and ``XDG_{DATA,CONFIG,CACHE}_HOME`` set to its own empty directory: a same-uid kernel (trusted
or ``--sandbox off``) could have planted fonts or a fontconfig file in the user's ``~/.fonts``,
``~/.local/share/fonts`` or ``~/.config/fontconfig``, and the server never parses what a kernel wrote. A build
killed midway leaves a ``.matplotlib-*`` directory in the cache: the next start removes stale ones.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from kernelexec.host import KernelReach, helper_env, run_python

logger = logging.getLogger(__name__)

SUBDIR = "matplotlib"
BUILD_TIMEOUT = 120.0
# run as ``python -I -c``: the font list into $MPLCONFIGDIR, and nothing else
BUILD = "import matplotlib.font_manager as fm; print(fm.FontManager.__version__)"


def font_cache_dir(cache_dir: Path) -> Path:
    return Path(cache_dir) / SUBDIR


def font_lists(directory: Path) -> list[Path]:
    return sorted(directory.glob("fontlist-v*.json")) if directory.is_dir() else []


def ready(cache_dir: Path, reach: KernelReach) -> Path | None:
    """The prepared directory, if it exists and no kernel of this configuration can write it. Offered while the
    list is still being built too: a kernel links what is there when it boots (startup/kernel_init.py)."""
    directory = font_cache_dir(cache_dir)
    if not directory.is_dir() or reach.writes(directory):
        return None
    return directory


def reserve(cache_dir: Path, reach: KernelReach) -> Path | None:
    """Make the directory (offered to kernels from now on, empty until ``prepare`` has built the list); None
    when a kernel of this configuration could write it."""
    directory = font_cache_dir(cache_dir)
    if reach.writes(directory):
        return None
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    return directory


def remove_stale_builds(cache_dir: Path) -> None:
    """``.matplotlib-*`` build directories a killed server left (older than a build may take: not another's)."""
    cutoff = time.time() - 2 * BUILD_TIMEOUT
    for stale in Path(cache_dir).glob(".matplotlib-*"):
        with contextlib.suppress(OSError):
            if stale.is_dir() and not stale.is_symlink() and stale.lstat().st_mtime < cutoff:
                shutil.rmtree(stale, ignore_errors=True)


def prepare(cache_dir: Path, reach: KernelReach) -> Path | None:
    """Build the font list once (kept across restarts: rebuilt only when missing); None when matplotlib is
    not installed beside kernelexec, when a kernel could write the cache directory, or when the build fails.
    The directory is made first (``reserve``: kernels started meanwhile are offered it), each list renamed into it whole."""
    directory = reserve(cache_dir, reach)
    if directory is None:
        return None
    remove_stale_builds(cache_dir)
    if font_lists(directory):
        return directory
    if importlib.util.find_spec("matplotlib") is None:
        return None
    building = Path(tempfile.mkdtemp(prefix=".matplotlib-", dir=cache_dir))
    home = building / "home"  # empty: no user's fonts or fontconfig, which a kernel may have written
    try:
        home.mkdir()
        isolated = {"HOME": str(home), "XDG_DATA_HOME": str(home), "XDG_CONFIG_HOME": str(home),
                    "XDG_CACHE_HOME": str(home), "MPLCONFIGDIR": str(building)}
        done = run_python(["-c", BUILD], timeout=BUILD_TIMEOUT, env=helper_env(isolated))
        built = font_lists(building)
        if done.returncode != 0 or not built:
            logger.warning("matplotlib's font list could not be prepared: %s", (done.stderr or "").strip()[-500:])
            return None
        for path in built:  # only the list: whatever else matplotlib left there is not offered
            path.chmod(0o644)
            os.replace(path, directory / path.name)  # atomic: a kernel never reads half a list
        return directory
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("matplotlib's font list could not be prepared: %s", exc)
        return None
    finally:
        shutil.rmtree(building, ignore_errors=True)
