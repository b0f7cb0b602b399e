"""Shared fixtures: real kernels behind a real MCP server, reached through real MCP clients.

Kernels are expensive (~0.5 s each), so one server and its sessions are shared per test module;
tests that need a clean kernel open their own session with ``new_session``. The helpers these fixtures
use live in tests/support.py (the benchmarks use them too); they are re-exported here for the modules
that import them from ``.conftest``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from .support import (  # noqa: F401 - re-exported
    Harness,
    clean_env,
    free_port,
    http_server,
    kernelexec_cmd,
    make_settings,
    pids_with,
    serving,
    start_harness,
    stop,
    wait_for_port,
)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"  # jupyter_client does not run on trio


@pytest.fixture(scope="session")
def short_tmp() -> Iterator[Path]:
    """A short base directory: unix socket paths must stay under 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="kxt"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
async def harness(short_tmp: Path) -> AsyncIterator[Harness]:
    """The default server (standard profile, all tools), shared by a module."""
    async with serving(make_settings(short_tmp)) as h:
        yield h


@pytest.fixture(scope="session")
def overlay_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kernelexec's cache dir for the whole test session (overlays built at most once per interpreter)."""
    cache = getattr(request.config, "cache", None)
    return Path(cache.mkdir("kernelexec-cache")) if cache is not None else tmp_path_factory.mktemp("kxcache")


@pytest.fixture(scope="module", autouse=True)
def no_pip_environment_leaks() -> Iterator[None]:
    """pip's settings (PIP_CONFIG_FILE=/dev/null and the like) set for one module must not reach the next
    module's installs: a module that leaves them changed fails here."""
    before = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    assert after == before, f"this module leaked pip settings into the environment of the rest: {before} -> {after}"
