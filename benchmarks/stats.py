"""Pure helpers for the benchmarks: percentiles, summaries, the results table. Stdlib only, no I/O."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between closest ranks (numpy's default)."""
    if not samples:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100]; got {q!r}")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(samples: Sequence[float]) -> float:
    return percentile(samples, 50)


@dataclass
class Measurement:
    """One row of the table: samples in ``unit``, optionally compared with the row named ``baseline``.

    ``ratio`` is this row's median divided by the baseline's median, so for times and memory
    lower is better and 1.00 means "as fast/small as the baseline"; for ``calls/s`` higher is better.
    """

    name: str
    unit: str
    samples: list[float]
    baseline: str | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.samples)

    def summary(self) -> dict[str, float]:
        s = self.samples
        return {
            "median": median(s),
            "p95": percentile(s, 95),
            "p99": percentile(s, 99),
            "min": min(s) if s else math.nan,
            "max": max(s) if s else math.nan,
            "mean": sum(s) / len(s) if s else math.nan,
        }


def ratios(rows: Sequence[Measurement]) -> dict[str, float | None]:
    """Median of each row over the median of the row it names as baseline (None without one)."""
    by_name = {r.name: r for r in rows}
    out: dict[str, float | None] = {}
    for r in rows:
        base = by_name.get(r.baseline) if r.baseline else None
        if base is None or not base.samples or not r.samples:
            out[r.name] = None
            continue
        b = median(base.samples)
        out[r.name] = median(r.samples) / b if b else None
    return out


def fmt_value(value: float, unit: str) -> str:
    """A number with sensible precision for its size: 0.0123 -> 0.0123, 12.3456 -> 12.35, 1234.5 -> 1,234."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    a = abs(value)
    if a >= 1000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    if a == 0:
        return "0"
    return f"{value:.3g}"


def table(rows: Sequence[Measurement], *, p99: bool = True) -> str:
    """A plain-text table: name, n, unit, median, p95 (p99), baseline and ratio to it."""
    rat = ratios(rows)
    head = ["measurement", "n", "unit", "median", "p95"] + (["p99"] if p99 else []) + ["vs baseline", "ratio"]
    body = []
    for r in rows:
        s = r.summary()
        ratio = rat[r.name]
        cells = [r.name, str(r.n), r.unit, fmt_value(s["median"], r.unit), fmt_value(s["p95"], r.unit)]
        if p99:
            cells.append(fmt_value(s["p99"], r.unit))
        cells += [r.baseline or "-", "-" if ratio is None else f"{ratio:.2f}x"]
        body.append(cells)
    return render_grid(head, body, right_align={1, 3, 4, 5, 7} if p99 else {1, 3, 4, 6})


def render_grid(head: Sequence[str], body: Sequence[Sequence[str]], right_align: set[int] = frozenset()) -> str:
    widths = [max(len(str(row[i])) for row in [head, *body]) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(cells):
            out.append(str(c).rjust(widths[i]) if i in right_align else str(c).ljust(widths[i]))
        return "| " + " | ".join(out) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(r) for r in body)])


def to_json(rows: Sequence[Measurement]) -> list[dict[str, Any]]:
    """Rows as plain data (summary, ratio, raw samples) for ``--json``."""
    rat = ratios(rows)
    return [
        {
            "name": r.name,
            "unit": r.unit,
            "n": r.n,
            **{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.summary().items()},
            "baseline": r.baseline,
            "ratio": rat[r.name],
            "note": r.note,
            **({"extra": r.extra} if r.extra else {}),
            "samples": r.samples,
        }
        for r in rows
    ]
