"""Any valid nbformat notebook replays, whatever its ``metadata.kernelexec`` holds.

The metadata is data from anywhere (another tool, a hand edit, an attacker): every JSON type at every
place kernelexec reads it goes through the readers in ``kernelexec/recording.py``. The full fuzz matrix
runs against those readers and everything replay and restore compute from them (no kernel); a handful
of representative notebooks run through the real ``kernelexec replay`` command (one kernel each).
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import nbformat
import pytest

from kernelexec.session.record_meta import ENDINGS, EVENTS, CellMeta, NotebookMeta, read_cell_meta, read_notebook_meta
from kernelexec.session.replay import _session_roots
from kernelexec.session.replay_cli import ignored_metadata, installs_line, recorded_installs
from kernelexec.session.restore import cell_timeout, restorable

from .conftest import clean_env, kernelexec_cmd, make_settings

# every JSON type, and the awkward values of each (NaN and infinities: Python's json reads them)
VALUES: list[Any] = [
    "x", "", "\x00", "/", "../etc", "install", "restart", "completed",
    0, 1, -1, 2**63, 10**400, 3.5, -0.0, 1e308, math.nan, math.inf, -math.inf,
    True, False, None,
    [], ["x"], [1, None], [[[]]], ["numpy", 5],
    {}, {"a": 1}, {"event": 5}, {"python": 3, "version": []}, {"x": {"y": {"z": [None]}}},
]
NOTEBOOK_KEYS = ["session", "profile", "environment", "created", "replay", "limits", "timeout"]
CELL_KEYS = ["event", "specs", "cwd", "success", "timeout", "ending", "profile", "limits", "layers", "installed",
             "session", "replayed"]


def ids(values: list[Any]) -> list[str]:
    return [f"{type(v).__name__}:{str(v)[:12]!r}" for v in values]


def notebook(nb_meta: Any = None, cell_metas: list[tuple[str, Any]] = ()) -> nbformat.NotebookNode:  # type: ignore[assignment]
    """A valid notebook with ``metadata.kernelexec = nb_meta`` (unless None) and one cell per
    (cell_type, metadata.kernelexec) given, plus a plain code cell."""
    nb = nbformat.v4.new_notebook()
    if nb_meta is not None:
        nb.metadata["kernelexec"] = nb_meta
    for kind, meta in cell_metas:
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        nb.cells.append(make("1 + 1" if kind == "code" else "*kernelexec: marker*", metadata={"kernelexec": meta}))
    nb.cells.append(nbformat.v4.new_code_cell("2 + 2"))
    return nb


def check_notebook_meta(meta: NotebookMeta) -> None:
    assert meta.session is None or isinstance(meta.session, str)
    assert meta.profile is None or isinstance(meta.profile, str)
    assert meta.environment is None or (len(meta.environment) == 2
                                        and all(v is None or isinstance(v, str) for v in meta.environment))
    assert all(isinstance(line, str) and "\n" not in line for line in meta.ignored)


def check_cell_meta(meta: CellMeta) -> None:
    assert isinstance(meta.recorded, bool) and isinstance(meta.success, bool)
    assert meta.event is None or meta.event in EVENTS
    assert isinstance(meta.specs, tuple) and all(isinstance(s, str) for s in meta.specs)
    assert meta.cwd is None or (isinstance(meta.cwd, str) and meta.cwd.startswith("/") and "\x00" not in meta.cwd)
    assert meta.timeout is None or (isinstance(meta.timeout, float) and math.isfinite(meta.timeout) and meta.timeout > 0)
    assert meta.ending in ENDINGS
    assert all(isinstance(line, str) and "\n" not in line for line in meta.ignored)
    assert isinstance(cell_timeout(meta.timeout, 30.0, 60.0), float)


def check_everything_replay_reads(nb: nbformat.NotebookNode) -> None:
    """What replay and restore compute from the metadata, before a kernel starts: none of it may raise."""
    check_notebook_meta(read_notebook_meta(nb.metadata))
    for cell in nb.cells:
        check_cell_meta(read_cell_meta(cell))
    assert all(isinstance(r, str) for r in _session_roots(nb))
    installs = recorded_installs(nb)
    assert all(isinstance(s, str) for i in installs for s in i.specs)
    for install in (False, True):
        assert "\n" not in installs_line(installs, install=install, policy="any")
    assert all(isinstance(line, str) for line in ignored_metadata(nb))
    restorable(nb.cells)
    restorable(json.loads(json.dumps(nb.cells, default=str)))  # as the journal holds them: plain dicts


# --- the readers, over the whole matrix (no kernel) -------------------------------------------------
@pytest.mark.parametrize("value", VALUES, ids=ids(VALUES))
def test_any_notebook_level_kernelexec_metadata_is_read_or_ignored(value: Any) -> None:
    places = [value, {key: value for key in NOTEBOOK_KEYS}, {"environment": {"python": value, "version": value}},
              {"environment": {"python": value}}, {"session": "h", "profile": "standard", "extra": value}]
    places += [{key: value} for key in NOTEBOOK_KEYS]
    for place in places:
        nb = notebook(place)
        nbformat.validate(nb)  # the notebook is valid nbformat: replay must handle it
        check_everything_replay_reads(nb)
    if not isinstance(value, dict) and value is not None:
        assert read_notebook_meta({"kernelexec": value}).ignored  # said, not silently dropped


@pytest.mark.parametrize("value", VALUES, ids=ids(VALUES))
@pytest.mark.parametrize("kind", ["code", "markdown", "raw"])
def test_any_cell_level_kernelexec_metadata_is_read_or_ignored(kind: str, value: Any) -> None:
    places = [value, {key: value for key in CELL_KEYS}, {"event": "install", "specs": value},
              {"event": "install", "specs": [value]}, {"event": value, "specs": ["kxdemo"]},
              {"success": True, "cwd": value, "timeout": value}]
    places += [{key: value} for key in CELL_KEYS]
    for place in places:
        nb = notebook(None, [(kind, place)]) if kind != "raw" else notebook(None, [])
        if kind == "raw":
            nb.cells.insert(0, nbformat.v4.new_raw_cell("raw", metadata={"kernelexec": place}))
        nbformat.validate(nb)
        check_everything_replay_reads(nb)
    if not isinstance(value, dict) and value is not None:
        assert read_cell_meta({"cell_type": kind, "metadata": {"kernelexec": value}}).ignored


@pytest.mark.parametrize("cell", [None, 5, "x", [], {}, {"metadata": None}, {"metadata": "x"}, {"metadata": []},
                                  {"cell_type": 5, "metadata": {"kernelexec": {"event": "restart"}}}])
def test_a_journal_line_of_any_shape_is_read_as_no_metadata(cell: Any) -> None:
    meta = read_cell_meta(cell)
    check_cell_meta(meta)
    assert meta.event is None  # an event counts on a markdown cell only


def test_what_kernelexec_writes_is_read_back_whole() -> None:
    marker = {"cell_type": "markdown", "metadata": {"kernelexec": {"event": "install", "specs": ["kxdemo==1.0"]}}}
    assert read_cell_meta(marker) == CellMeta(recorded=True, event="install", specs=("kxdemo==1.0",))
    code = {"cell_type": "code", "metadata": {"kernelexec": {"cwd": "/w", "timeout": 30, "success": True, "ending": "interrupted",
                                                             "profile": "standard", "layers": ["landlock"]}}}
    assert read_cell_meta(code) == CellMeta(recorded=True, cwd="/w", timeout=30.0, success=True, ending="interrupted")
    top = read_notebook_meta({"kernelexec": {"session": "h", "profile": "standard", "environment": {"python": "/p", "version": "3.12"}}})
    assert top == NotebookMeta(session="h", profile="standard", environment=("/p", "3.12"))


def test_what_is_ignored_is_named_by_type_never_echoed() -> None:
    nb = notebook({"profile": 3, "environment": "\x1b]evil"}, [("code", {"timeout": "\x1b[31mx", "success": "yes"}),
                                                               ("markdown", {"event": 5}), ("markdown", "a string")])
    ignored = ignored_metadata(nb)
    assert ignored == ["notebook: profile is a number, not a string", "notebook: environment is a string, not an object",
                       "cell 1: success is a string, not a boolean", "cell 1: timeout is a string, not a positive number",
                       "cell 2: event is a number, not one of restart, restore, revive, install",
                       "cell 3: metadata.kernelexec is a string, not an object"]


# --- the real command, a few representative notebooks (one kernel each) -----------------------------
def replay(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(kernelexec_cmd("replay", *args, str(path)), capture_output=True, text=True, timeout=240,
                          env=clean_env())


def assert_clean(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode in (0, 1, 2), proc.stdout + proc.stderr  # the CLI's documented exit codes
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("case", ["not-objects", "wrong-typed-fields"])
def test_the_command_replays_notebooks_with_foreign_kernelexec_metadata(case: str, tmp_path: Path, short_tmp: Path) -> None:
    if case == "not-objects":
        nb = notebook("a string", [("code", ["a", "list"]), ("markdown", 5), ("code", None), ("markdown", "restart")])
    else:
        nb = notebook({"profile": 3, "session": [], "environment": "x", "timeout": "x", "limits": []},
                      [("code", {"timeout": "x", "ending": 5, "success": "yes", "cwd": 7, "limits": [], "profile": 3}),
                       ("markdown", {"event": 5}), ("markdown", {"event": "install", "specs": "numpy"}),
                       ("markdown", {"event": "install", "specs": [1, None]}), ("markdown", {"event": "explode"}),
                       ("code", {"timeout": 10**400, "cwd": "/nonexistent\x00", "ending": "completed", "success": True})])
    source, out = tmp_path / "foreign.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, source)
    proc = replay(source, "--state-dir", str(short_tmp / case), "-o", str(out))
    assert_clean(proc)
    # not-objects: no kernelexec metadata is read, so the cells never ran before (new): 0. wrong-typed-fields:
    # cells 1 and 6 say they ran (a kernelexec object) yet have no outputs, so replaying them differs: 1
    assert proc.returncode == (0 if case == "not-objects" else 1), proc.stdout + proc.stderr
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note: kernelexec metadata")]
    assert len(notes) == 1 and "ignored" in notes[0], proc.stdout
    written = nbformat.read(out, as_version=4)
    nbformat.validate(written)
    assert written.metadata.kernelexec["replay"]["different"] == ([] if case == "not-objects" else [1, 6])
    assert "installs recorded" not in proc.stdout  # an install marker without a list of names installs nothing
    assert written.cells[-1].outputs[0].data["text/plain"] == "4"


NOT_NOTEBOOKS = ['{"cells": "x"}', "[]", "not json", "", '{"nbformat": true}', '{"nbformat": 4, "nbformat_minor": 5, "metadata": 5, "cells": []}',
                 '{"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": "x"}', '{"nbformat": 1, "cells": ["x"]}',
                 *(f'{{"nbformat": 4, "nbformat_minor": 5, "metadata": {{"kernelexec": {"[" * n + "]" * n}}}, "cells": []}}'
                   for n in (600, 100_000))]  # nesting: nbformat's reader, then json's, run out of stack


@pytest.mark.anyio
@pytest.mark.parametrize("text", NOT_NOTEBOOKS, ids=[t[:40] for t in NOT_NOTEBOOKS])
async def test_a_file_that_is_not_a_notebook_exits_2_with_one_line(
    text: str, tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kernelexec.session.replay_cli import replay_command

    path = tmp_path / "bad.ipynb"
    path.write_text(text)
    assert await replay_command(make_settings(short_tmp), str(path), output=None, profile=None) == 2
    said = capsys.readouterr()
    assert said.out == "" and len(said.err.splitlines()) == 1, said
    assert said.err.startswith(f"kernelexec replay: cannot read {path}: not a "), said.err


@pytest.mark.slow
def test_the_command_exits_2_with_one_line_and_no_traceback(tmp_path: Path, short_tmp: Path) -> None:
    path = tmp_path / "bad.ipynb"
    path.write_text('{"cells": "x"}')  # a traceback from nbformat's converter before
    proc = replay(path, "--state-dir", str(short_tmp / "bad"))
    assert_clean(proc)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = [line for line in proc.stderr.splitlines() if " WARNING " not in line]  # degraded-sandbox warnings aside
    assert len(said) == 1 and said[0].startswith("kernelexec replay: cannot read"), proc.stderr
