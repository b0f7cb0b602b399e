"""What recording one cell costs when the notebook already holds 10 cells and 5,000 cells.

    python -m benchmarks --only recording [--quick]      (or: python -m benchmarks.recording [--quick])

No kernel: ``kernelexec.session.recording.Recorder`` is driven directly with a realistic ``Execution``
(``print`` output plus a ~22 KB PNG as a ``display_data``: a ~30 KB journal line).

Rows (same names on every kernelexec tree, so before/after tables line up):
- ``record: append one cell, N cells``: ``Recorder.append``, i.e. what a call pays before its answer
  goes out. Appending in place (``Recorder.start`` exists) that is the journal line and the notebook
  write; on the older design (no ``start``) it is the journal line only, and the notebook was
  materialised later by ``write_notebook`` after each burst of calls.
- ``record: write_notebook from the journal, N cells``: the whole notebook written again from the
  journal. The older design ran it after each burst of calls (so it was the per-cell cost of
  keeping the notebook current in an interactive session); the in-place design runs it only when
  a notebook is torn or behind its journal (server start, replay).

The 10-cell samples each use a directory holding 10 to 19 cells (a fresh one every 10 samples);
the 5,000-cell ones one directory holding 5,000 cells and up. 10- and 5,000-cell samples alternate,
so drift on the machine hits both alike. Files are fsynced: the numbers depend on the disk of /tmp.
"""

from __future__ import annotations

import argparse
import base64
import random
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # ``python benchmarks/recording.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import log, short_tmp
from benchmarks.stats import Measurement, table

SMALL, LARGE = 10, 5_000
PNG_BYTES = 22 * 1024  # base64: ~30 KB of text, a small matplotlib figure
CODE = "import matplotlib.pyplot as plt\nplt.plot(range(10))\nprint('step', 42)\nplt.show()"


def make_execution(i: int) -> Any:
    from kernelexec.kernel.execution import Execution

    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + random.Random(i).randbytes(PNG_BYTES)).decode()
    stdout = f"step {i}: loss=0.{i % 997:03d}\n" * 3
    outputs = [
        {"output_type": "stream", "name": "stdout", "text": stdout},
        {"output_type": "display_data", "data": {"image/png": png, "text/plain": "<Figure size 640x480 with 1 Axes>"},
         "metadata": {}},
    ]
    return Execution(code=CODE, stdout=stdout, outputs=outputs, execution_count=i, duration_ms=12.5)


META = {"session": "bench", "profile": "standard", "cwd": "/tmp/work", "layers": ["landlock", "seccomp"], "timeout": 30.0}


def in_place() -> bool:
    """True when this kernelexec's Recorder appends to the notebook in place (it has ``start``)."""
    from kernelexec.session.recording import Recorder

    return hasattr(Recorder, "start")


def prepared(directory: Path, cells: int) -> Any:
    """A Recorder whose journal (and, appending in place, notebook) already holds ``cells`` cells.
    The journal lines are written directly (one ``cell_record`` each), the notebook once from them."""
    import json

    from kernelexec.session.recording import Recorder, cell_record

    directory.mkdir(parents=True)
    recorder = Recorder(directory / "journal.jsonl", directory / "notebook.ipynb", {"session": directory.name})
    with open(recorder.journal, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(cell_record(make_execution(i), META), separators=(",", ":")) + "\n"
                      for i in range(1, cells + 1))
    if in_place():
        recorder.start()  # O(journal) once per recorder, as the server does when a session starts
    else:
        recorder.write_notebook()
    return recorder


def ms(seconds: float) -> float:
    return seconds * 1000


def timed(fn: Any, *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return ms(time.perf_counter() - t0)


def measure(base: Path, appends: int, rewrites: int) -> list[Measurement]:
    mode = "journal line + notebook appended in place" if in_place() else "journal line only (old design: notebook written later)"
    log(f"[recording] {appends} appends and {rewrites} write_notebook calls each at {SMALL} and {LARGE:,} cells ({mode})")
    t0 = time.perf_counter()
    large = prepared(base / "large", LARGE)
    size_mb = large.notebook.stat().st_size / 1e6
    log(f"[recording] built the {LARGE:,}-cell journal and notebook ({size_mb:.0f} MB) in {time.perf_counter() - t0:.1f} s")
    smalls: list[Any] = []
    exes = [make_execution(LARGE + 1 + i) for i in range(appends + 1)]
    large.append(exes[-1], META)  # warm-up (first open, page cache)
    a_small, a_large = [], []
    for i in range(appends):
        if i % 10 == 0:
            smalls.append(prepared(base / f"small{len(smalls)}", SMALL))
            smalls[-1].append(exes[-1], META)  # warm-up; this directory now holds 11 cells
        a_small.append(timed(smalls[-1].append, exes[i], META))
        a_large.append(timed(large.append, exes[i], META))
    w_small, w_large = [], []
    small = smalls[0]
    small.write_notebook()
    for _ in range(rewrites):
        w_small.append(timed(small.write_notebook))
        w_large.append(timed(large.write_notebook))
    n_large = LARGE + appends + 1
    append_note = f"{mode}; fsynced, in {base.parent}"
    rewrite_note = ("the notebook rewritten from the journal after each burst of calls (nbformat)" if not in_place()
                    else "only when a notebook is torn or behind its journal (server start, replay)")
    s_append, s_write = f"record: append one cell, {SMALL} cells", f"record: write_notebook from the journal, {SMALL} cells"
    return [
        Measurement(s_append, "ms", a_small, note=append_note),
        Measurement(f"record: append one cell, {LARGE:,} cells", "ms", a_large, baseline=s_append,
                    note=f"{LARGE:,} to {n_large:,} cells, ~{size_mb:.0f} MB notebook"),
        Measurement(s_write, "ms", w_small, note=rewrite_note),
        Measurement(f"record: write_notebook from the journal, {LARGE:,} cells", "ms", w_large, baseline=s_write,
                    note=f"{n_large:,} cells"),
    ]


async def bench_recording(plan: Any, base: Path, out: list[Measurement]) -> None:
    """The ``recording`` section of ``python -m benchmarks``."""
    quick = getattr(plan, "quick", False)
    out.extend(measure(base / "recording", appends=30 if quick else 200, rewrites=2 if quick else 7))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recording", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    with short_tmp() as base:
        rows = measure(base, appends=30 if args.quick else 200, rewrites=2 if args.quick else 7)
    print(table(rows))
    for r in rows:
        if r.note:
            print(f"  {r.name}: {r.note}")


if __name__ == "__main__":
    main()
