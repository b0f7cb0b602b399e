"""Red-team follow-ups (2026-12-01): holes found in today's surfaces, each a failing test until fixed.

Real parts only: a real server in memory, real sandboxed kernels, real pip.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from .conftest import make_settings, serving

pytestmark = [pytest.mark.anyio, pytest.mark.kernels_as_shipped]


def _sdist_with_in_tree_backend(canary: Path) -> bytes:
    """An sdist that needs no build dependencies: its build backend is in the tree (backend-path), so pip
    imports and runs it at once, with no index. The backend writes ``canary`` when imported."""
    files = {
        "evil-1.0/pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "evil-1.0/backend.py": (
            "import os, pathlib\n"
            f"pathlib.Path({str(canary)!r}).write_text(f'build backend ran as uid {{os.getuid()}}, pid {{os.getpid()}}')\n"
            "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
            "def prepare_metadata_for_build_wheel(d, config_settings=None):\n    raise SystemExit(1)\n"
            "def build_wheel(d, config_settings=None, metadata_directory=None):\n    raise SystemExit(1)\n"),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def test_a_pip_line_naming_an_archive_the_kernel_wrote_never_runs_its_build_backend_on_the_host(
        short_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``evil.tar.gz`` passes ``parse_specs`` (dots are name characters), and pip treats a requirement that
    looks like an archive file name as a local file, relative to the server's cwd — and builds an sdist
    despite ``--only-binary :all:``. With ``--working-dir`` (the plugin preset: the server's start
    directory), the kernel can write that file, so a cell escapes the sandbox: the backend runs on the host
    as the server's user, with the network and none of the sandbox's layers."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    project = tmp_path / "project"
    project.mkdir()
    outside = tmp_path / "outside"  # not a work root: the kernel cannot write here
    outside.mkdir()
    canary = outside / "CANARY"
    wheelhouse = tmp_path / "wheelhouse"  # empty: pip gets --no-index, so nothing comes from the network
    wheelhouse.mkdir()
    monkeypatch.chdir(project)  # the server started in the project, as Claude Code starts it
    settings = make_settings(short_tmp, working_dir=project, find_links=wheelhouse, pool_size=0, restart_spares=0)
    payload = _sdist_with_in_tree_backend(canary).hex()
    async with serving(settings) as h:
        s = await h.new_session()
        probe = await h.run(f"open({str(canary)!r}, 'w')", session=s)
        assert not probe["success"], "the kernel itself must not be able to write the canary"
        wrote = await h.run(f"open('evil.tar.gz', 'wb').write(bytes.fromhex({payload!r}))", session=s)
        assert wrote["success"], wrote
        assert (project / "evil.tar.gz").exists()
        await h.call("execute_code", code="%pip install evil.tar.gz", session=s)
        await h.call("install_packages", packages=["evil.tar.gz"], session=s)
    assert not canary.exists(), f"host code execution outside the sandbox: {canary.read_text()}"


async def test_rich_output_metadata_counts_against_the_output_caps(short_tmp: Path) -> None:
    """The collector sizes a rich output by its ``data`` only; ``metadata`` (and an update's metadata) is
    kept whatever its size. A 40 MiB ``data`` is dropped (over ``max_output_bytes``) but the same 40 MiB
    as ``metadata`` is kept, in memory, the journal and the notebook — and 1,000 such outputs per cell
    (``max_outputs``) would hold tens of GiB in the server."""
    from kernelexec.kernel.collector import Caps

    from .test_hostile_kernel import SENDER

    cap = Caps().max_output_bytes
    async with serving(make_settings(short_tmp, pool_size=0, restart_spares=0)) as h:
        s = await h.new_session()
        await h.run(SENDER, session=s)
        dropped = await h.run("_send('display_data', {'data': {'text/plain': 'y' * (40 << 20)}, 'metadata': {}})", session=s)
        assert any("dropped" in n for n in dropped["notes"]), dropped["notes"]
        r = await h.run("_send('display_data', {'data': {'text/plain': 'small'}, 'metadata': {'pad': 'x' * (40 << 20)}})",
                        session=s)
        size = Path(r["notebook"]).stat().st_size
    assert size < cap, f"a rich output's metadata of 40 MiB was kept (notebook {size:,} bytes; cap {cap:,})"


async def test_a_kernels_overflowing_float_never_makes_the_notebook_invalid_json(short_tmp: Path) -> None:
    """``wire.loads`` maps the ``NaN``/``Infinity`` literals to null, but JSON's ``1e999`` decodes to
    ``float('inf')``, which ``json.dumps`` writes as ``Infinity``: the notebook file is then not JSON
    (JupyterLab, GitHub and any strict parser refuse it; Python's json alone accepts it)."""
    import json

    from .test_hostile_kernel import SENDER

    async with serving(make_settings(short_tmp, pool_size=0, restart_spares=0)) as h:
        s = await h.new_session()
        await h.run(SENDER, session=s)
        r = await h.run("""_send('display_data', '{"data": {"application/json": {"x": 1e999}, "text/plain": "inf"}, '
                        '"metadata": {"m": -1e999}}', raw=True)""", session=s)
        text = Path(r["notebook"]).read_text()

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    json.loads(text, parse_constant=refuse)
