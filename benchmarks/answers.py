"""What one answer costs the model: characters (and a token estimate) per ``execute_code`` answer.

    python -m benchmarks --only answers [--quick]       (or: python benchmarks/answers.py [--json FILE])

Ten typical calls, in order, in one session of a fresh in-memory server (standard profile): an
assignment, an expression, a ``result`` dict, a ``print`` loop, a matplotlib plot, a 50-row DataFrame as
the last expression (and the same DataFrame through ``display``), an exception raised in a function, a
refused import and a missing module. For each answer:

- ``text chars``: the characters of every non-image content block as the client receives it (text
  blocks' text, embedded resources' text, resource links' JSON): what the model reads as text;
- ``tokens (est.)``: that over 4, the usual rough rate for English and code;
- ``images``: how many image blocks (the model sees them as images whatever their base64 size);
- ``structured chars``: the structured content's JSON (for apps and scripts; clients that copy it
  into the model's context pay this too).

The rows are deterministic (one sample each). To compare two trees, run this file with the other
tree first on ``PYTHONPATH``: ``benchmarks/`` is found after it, so ``kernelexec`` comes from that tree.

Measured here (December; before = 216b81d, embedded SVG/HTML; after = lean content for the model), text chars
(~tokens): plot 15,254 (~3,814) -> 571 (~143); DataFrame 6,591 (~1,648) -> 1,580 (~395); display(DataFrame)
5,478 (~1,370) -> 1,581 (~395); print 288 (~72) -> 288 (~72). Structured content: the same before and after.
(Those four were measured each in its own server, before the ten below replaced them.)

Measured here (December; before = 09c665d, after = answers read at a glance: the header's profile/python/layers
once per session, figures PNG only, no kernelexec frames in tracebacks, an install line for a missing
module), text chars per answer, before -> after: assignment 178 -> 178 (the first answer keeps the header);
expression 222 -> 86; result dict 256 -> 119; print 302 -> 165; plot 585 -> 139 (no SVG link); DataFrame
1,594 -> 1,458; display(DataFrame) 1,595 -> 1,459; error 596 -> 461; refused import 1,452 -> 932 (no guard
frames); missing module 736 -> 550 (no guard frames, one install line added). All ten: 7,516 -> 5,547
(-26%). Structured chars: the same but plot 1,183 -> 979, refused import 2,052 -> 1,650, missing module
1,335 -> 1,281.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # ``python benchmarks/answers.py``: the tree on PYTHONPATH (if any) wins
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import anyio

MISSING = "kxmissingpkg"  # allowed by name (allow_imports), installed nowhere: a ModuleNotFoundError
# ten typical calls, in order, in one session; the ones that fail on purpose are named in FAILING
CELLS = {
    "assignment": "x = 41",
    "expression": "x + 1",
    "result dict": "result = {'mean': 2.5, 'n': 4, 'label': 'ok'}",
    "print": "for i in range(5):\n    print('step', i, 'loss', round(1 / (i + 1), 3))",
    "plot": "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 3, 2, 5, 4])\nplt.show()",
    "dataframe": "import pandas as pd\ndf = pd.DataFrame({'x': range(50), 'y': [i * i for i in range(50)], "
                 "'name': [f'row {i}' for i in range(50)]})\ndf",
    "dataframe display": "from IPython.display import display\ndisplay(df)",
    "error": "def pick(d):\n    return d['missing']\n\npick({})",
    "refused import": "import subprocess",
    "missing module": f"import {MISSING}",
}
FAILING = {"error", "refused import", "missing module"}


def weigh(content: list[Any], structured: dict[str, Any] | None) -> dict[str, int]:
    text = images = 0
    kinds: dict[str, int] = {}
    for block in content:
        kinds[block.type] = kinds.get(block.type, 0) + 1
        if block.type == "image":
            images += 1
        elif block.type == "text":
            text += len(block.text)
        elif block.type == "resource":
            text += len(getattr(block.resource, "text", "") or getattr(block.resource, "blob", ""))
        else:
            text += len(block.model_dump_json(by_alias=True, exclude_none=True))
    return {"text_chars": text, "tokens_est": round(text / 4), "images": images,
            "structured_chars": len(json.dumps(structured or {})), **{f"blocks_{k}": v for k, v in sorted(kinds.items())}}


async def measure() -> dict[str, dict[str, int]]:
    from mcp import Client

    from kernelexec.config import load_settings
    from kernelexec.server.build import build_server
    from kernelexec.session.manager import SessionManager

    found: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="kxa") as base:
        settings = load_settings(state_dir=Path(base) / "state", pool_size=0, allow_imports=[MISSING])
        sessions = SessionManager(settings)
        async with sessions.running():
            async with Client(build_server(settings, sessions)) as client:
                for name, code in CELLS.items():
                    result = await client.call_tool("execute_code", {"code": code})
                    assert not result.is_error and bool((result.structured_content or {}).get("success")) is (name not in FAILING), result
                    found[name] = weigh(result.content, result.structured_content)
    return found


async def bench_answers(plan: Any, base: Path, out: list[Any]) -> None:
    """The ``answers`` section of benchmarks/run.py: one row per cell and measure (same cost with --quick)."""
    from benchmarks.common import log
    from benchmarks.stats import Measurement

    log("[answers] characters per execute_code answer: ten typical calls in one session")
    for cell, weights in (await measure()).items():
        out.append(Measurement(f"answer: {cell}, text chars", "chars", [float(weights["text_chars"])],
                               note=f"~{weights['tokens_est']:,} tokens; {weights['images']} image(s)"))
        out.append(Measurement(f"answer: {cell}, structured chars", "chars", [float(weights["structured_chars"])]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the numbers to this file too")
    parser.add_argument("--quick", action="store_true", help="no effect: the section is already quick")
    args = parser.parse_args(argv)
    found = anyio.run(measure)
    import kernelexec

    print(f"kernelexec from {Path(kernelexec.__file__).parent.parent}")
    print(f"{'cell':<20} {'text chars':>10} {'tokens~':>8} {'images':>6} {'structured':>10}  blocks")
    for cell, w in found.items():
        blocks = ", ".join(f"{k[7:]} {v}" for k, v in w.items() if k.startswith("blocks_"))
        print(f"{cell:<20} {w['text_chars']:>10,} {w['tokens_est']:>8,} {w['images']:>6} {w['structured_chars']:>10,}  {blocks}")
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
