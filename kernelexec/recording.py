"""Every call of a session, recorded as a real notebook.

The durable record is an append-only journal (one JSON line per cell, flushed and fsynced before
the answer goes out), so a call costs the same in a 500-cell session as in the first. The
``.ipynb`` is materialised from the journal atomically (temp file + ``os.replace``) shortly after
each cell, on demand (resource reads, replay, close), and on start-up after a crash. A crash of the kernel, the server or the machine loses at most
the cell in flight. The session manager materialises dirty notebooks in the background.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .models import Execution


def cell_record(ex: Execution, meta: dict[str, Any]) -> dict[str, Any]:
    """The journal line for one call: an nbformat v4 code cell as plain JSON."""
    outputs = [dict(o) for o in ex.outputs]
    if ex.ending != "completed" and not any(o.get("output_type") == "error" for o in outputs):
        reason = ex.restart_reason or ("timed out" if ex.timed_out else ex.ending)
        outputs.append({"output_type": "error", "ename": "KernelexecError", "evalue": reason, "traceback": [reason]})
    tags = [] if ex.success else ["raises-exception"]
    return {
        "cell_type": "code",
        "execution_count": ex.execution_count,
        "source": ex.code,
        "outputs": outputs,
        "metadata": {
            "tags": tags,
            "kernelexec": {
                **meta,
                "duration_ms": ex.duration_ms,
                "ending": ex.ending,
                "timed_out": ex.timed_out,
                "restart_reason": ex.restart_reason,
                "success": ex.success,
            },
        },
    }


class Recorder:
    """Appends cells to a session's journal and keeps its notebook file up to date."""

    def __init__(self, journal: Path, notebook: Path, session_meta: dict[str, Any]) -> None:
        self.journal = journal
        self.notebook = notebook
        self.session_meta = session_meta
        self._dirty = journal.exists() and (
            not notebook.exists() or notebook.stat().st_mtime < journal.stat().st_mtime
        )

    def append(self, ex: Execution, meta: dict[str, Any]) -> None:
        line = json.dumps(cell_record(ex, meta), separators=(",", ":"))
        with open(self.journal, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._dirty = True

    def cells(self) -> list[dict[str, Any]]:
        """All recorded cells; a torn last line (a crash mid-write) is skipped."""
        if not self.journal.exists():
            return []
        cells = []
        with open(self.journal, encoding="utf-8") as fh:
            for line in fh:
                try:
                    cells.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return cells

    def write_notebook(self) -> Path:
        """Materialise the notebook from the journal, atomically."""
        import nbformat  # lazily: costs ~0.3 s at import

        nb = nbformat.v4.new_notebook()
        nb.metadata.update(
            {
                "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
                "language_info": {"name": "python"},
                "kernelexec": self.session_meta,
            }
        )
        for cell in self.cells():
            nb.cells.append(nbformat.from_dict({**cell, "id": f"cell-{len(nb.cells) + 1}"}))
        data = nbformat.writes(nb)
        fd, tmp = tempfile.mkstemp(dir=self.notebook.parent, prefix=".notebook-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.notebook)
        self._dirty = False
        return self.notebook

    @property
    def dirty(self) -> bool:
        return self._dirty

    def flush(self) -> Path | None:
        """Write the notebook if cells were appended since the last write."""
        if self._dirty:
            return self.write_notebook()
        return self.notebook if self.notebook.exists() else None
