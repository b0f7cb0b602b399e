"""Profiles: what each one lets user code do, as the policy the kernel's startup code enforces.

Pure data; no kernel needed to test it. The kernel side is ``startup/guard.py``.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from pathlib import Path
from typing import Any

from kernelexec.config import Profile
from kernelexec.layout import kernel_writable, startup_file

# The old safe executor's list, plus the four its description promised.
STRICT_IMPORTS = frozenset(
    {
        "collections", "datetime", "itertools", "math", "queue", "random", "re", "stat", "statistics",
        "time", "unicodedata", "json", "string", "functools", "operator", "getpass",
    }
)

# Code mode's module (startup/mcp_tools.py): importable under every profile; its calls go through the server.
CODE_MODE_MODULES = frozenset({"mcp_tools"})

# Broad stdlib, by one rule: refuse at import only what starts processes, opens the network or calls native
# code (subprocess, socket, ssl, ctypes, multiprocessing, pty, _posixsubprocess, posix), so the model gets the
# clear early error; everything else the OS layers already keep inside the session (importlib, signal, sqlite3:
# a module reached through importlib.__import__ still cannot start a process or connect; a signal reaches only
# the kernel's own PID namespace; sqlite's ATTACH only what Landlock grants). docs/security.md: "Why standard refuses".
STANDARD_STDLIB = frozenset(
    {
        "__future__", "abc", "argparse", "array", "ast", "asyncio", "base64", "binascii", "bisect", "builtins",
        "bz2", "calendar", "cmath", "codecs", "collections", "colorsys", "concurrent", "contextlib", "contextvars",
        "copy", "copyreg", "csv", "dataclasses", "datetime", "decimal", "difflib", "dis", "email", "enum", "errno",
        "fnmatch", "fractions", "functools", "getpass", "gettext", "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac",
        "html", "importlib", "inspect", "io", "ipaddress", "itertools", "json", "keyword", "linecache", "locale", "logging",
        "lzma", "math", "mimetypes", "numbers", "operator", "os", "pathlib", "pickle", "platform", "pprint",
        "queue", "random", "re", "reprlib", "secrets", "shlex", "shutil", "signal", "sqlite3", "statistics", "string", "stringprep",
        "struct", "sys", "tarfile", "tempfile", "textwrap", "threading", "time", "timeit", "tokenize",
        "tomllib", "traceback", "types", "typing", "typing_extensions", "unicodedata", "urllib", "uuid",
        "warnings", "weakref", "xml", "zipfile", "zlib", "zoneinfo",
    }
)

# Third-party packages the standard profile allows when they are installed.
DATA_STACK = frozenset(
    {
        "numpy", "pandas", "scipy", "matplotlib", "mpl_toolkits", "matplotlib_inline", "pylab", "seaborn", "sympy",
        "mpmath", "PIL", "sklearn", "statsmodels", "networkx", "pyarrow", "polars", "dateutil", "pytz",
        "tzdata", "tabulate", "tqdm", "IPython", "openpyxl", "bs4", "lxml", "yaml", "jinja2", "plotly",
        "altair", "bokeh", "numexpr", "bottleneck", "patsy", "xarray",
        "comm", "ipywidgets",  # ipykernel's own comm library, and widgets on it
    }
)


def python_read_roots() -> list[str]:
    """Where the interpreter, its libraries and the fonts/timezones they read live (read-only)."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sysconfig.get_paths()["stdlib"]}
    roots.update(site.getsitepackages())
    roots.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p))
    roots.update(
        p
        for p in ("/usr/share/fonts", "/usr/share/zoneinfo", "/usr/share/matplotlib", "/etc/fonts",
                  "/etc/localtime", "/usr/share/mime", "/dev/null", "/dev/urandom", "/usr/lib/python3",
                  "/usr/local/share/fonts")
        if os.path.exists(p)
    )
    return sorted(roots)


def kernel_policy(
    profile: Profile,
    *,
    session_dir: Path,
    spill_dir: Path,
    work_roots: list[Path],
    read_dirs: list[Path],
    allow_imports: list[str],
    result_cap: int,
    stream_cap: int,
    disk_cap: int,
    environment_paths: list[str] | None = None,
    protected: list[str] | None = None,
    warm_imports: list[str] | None = None,
    environment_modules: list[str] | None = None,
    packages_dir: Path | None = None,
    figure_formats: list[str] | None = None,
    checkpoint_dir: Path | None = None,
    checkpoint_cap: int = 0,
    font_cache: Path | None = None,
) -> dict[str, Any]:
    """The JSON the kernel's startup code reads (``KERNELEXEC_POLICY``). ``environment_paths``: what
    the kernel's interpreter reads (default: kernelexec's own); ``protected``: the environment a cell
    must not write; ``warm_imports``: modules a warm kernel imports ahead (those the profile allows);
    ``environment_modules``: a project environment's own top-level modules and the project's code,
    which standard allows too (environments.project_modules); ``figure_formats``: the inline backend's
    forms of a figure (default png, as Jupyter); ``font_cache``: matplotlib's font list prepared by the server
    (environment/fontcache.py), read-only to the kernel, which links it into its MPLCONFIGDIR."""
    read_dirs = [*read_dirs, *([font_cache] if font_cache is not None else [])]
    base: dict[str, Any] = {
        "profile": profile,
        "spill_dir": str(spill_dir),
        "packages_dir": str(packages_dir) if packages_dir is not None else None,
        "result_cap": result_cap,
        "stream_cap": stream_cap,
        "disk_cap": disk_cap,
        "figure_formats": list(figure_formats or ["png"]),  # Jupyter's default: png only
        "checkpoint_dir": str(checkpoint_dir) if checkpoint_dir is not None else None,
        "checkpoint_cap": checkpoint_cap,  # bytes; 0: no checkpoints
        "font_cache": str(font_cache) if font_cache is not None else None,
    }
    if profile == "trusted":
        return base | {"allowed_imports": None, "file_io": "all", "warm_imports": list(warm_imports or ())}
    guarded: dict[str, Any] = {"deny_process": True, "deny_network": True, "deny_tamper": True,
                               "readonly_roots": list(protected or ())}
    python_roots = python_read_roots()
    if environment_paths:
        python_roots = sorted({*python_roots, *environment_paths})
    # where installed code lives, even inside a work root (a .venv, kernelexec's own checkout): never a notebook's
    # own module to the guard (startup/guard.py)
    guarded["installed_roots"] = [*python_roots, str(Path(__file__).resolve().parents[1]), str(startup_file("guard.py").parent)]
    if profile == "strict":
        return base | guarded | {
            "allowed_imports": sorted(STRICT_IMPORTS | CODE_MODE_MODULES | set(allow_imports)),
            "file_io": "none",
            "write_roots": [],
            "read_roots": python_roots,
        }
    # a project file named like a refused stdlib module (subprocess.py) does not unlock that module
    project = set(environment_modules or ()) - (set(sys.stdlib_module_names) - STANDARD_STDLIB)
    allowed = STANDARD_STDLIB | DATA_STACK | CODE_MODE_MODULES | set(allow_imports) | project
    hint = ("most of the standard library (not subprocess, socket, ssl, ctypes, multiprocessing, "
            "pty) and the data stack: numpy, pandas, scipy, matplotlib, seaborn, sympy, PIL, sklearn, "
            "statsmodels, networkx, IPython.display")
    if project:
        hint += "; and the project's environment and code: " + ", ".join(sorted(project)[:40])
    return base | guarded | {
        "allowed_imports": sorted(allowed),
        "warm_imports": [m for m in warm_imports or () if m.partition(".")[0] in allowed],
        "imports_hint": hint,
        "file_io": "roots",
        "write_roots": [*map(str, kernel_writable(session_dir)), *map(str, work_roots)],
        "read_roots": [str(session_dir), *map(str, read_dirs), *python_roots],
    }


def describe(profile: Profile) -> str:
    """One line for answers and the docs: what the in-kernel layer of this profile does."""
    return {
        "strict": "imports limited to a short stdlib list; no file access; no subprocess, network or ctypes",
        "standard": "stdlib + data stack imports; files only in the session's directories; no subprocess, network or ctypes",
        "trusted": "no in-kernel guards",
    }[profile]
