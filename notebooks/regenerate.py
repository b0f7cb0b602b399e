"""Rebuild the notebooks in this directory (tests replay both with ``kernelexec replay``).

    python notebooks/regenerate.py

- ``quickstart.ipynb``: a short, commented session, executed by ``kernelexec.session.replay`` under the
  standard profile so its outputs are real.
- ``recorded-session.ipynb``: a session recorded by kernelexec itself: calls through a real MCP client
  (one failing, one plotting, one timing out), then ``restart_session(replay=True)``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import anyio
import nbformat
from mcp import Client

from kernelexec.config import load_settings
from kernelexec.session.replay import replay_notebook
from kernelexec.server.build import build_server
from kernelexec.session.manager import SessionManager

HERE = Path(__file__).resolve().parent

QUICKSTART = [
    ("md", "# kernelexec quickstart\n\n"
           "Each code cell below is one `execute_code` call an assistant made. The kernel is a real IPython "
           "kernel that lives as long as the session, so variables carry over from call to call. "
           "kernelexec records every session as a notebook like this one, and "
           "`kernelexec replay notebooks/quickstart.ipynb` runs it again and checks the outputs still match."),
    ("code", "prices = [12.5, 9.0, 31.25]\ntotal = sum(prices)\ntotal"),
    ("md", "The answer's `result` is the value of the last expression (or of a variable named `result`). "
           "Printed output comes back as `stdout`."),
    ("code", "for price in prices:\n    print(f\"{price:>6.2f}  {price / total:.0%}\")"),
    ("md", "An exception is a normal answer (`success: false`, `error`, `traceback`), not a failure of the tool. "
           "The recorded cell carries the `raises-exception` tag so a replay goes on past it."),
    ("code", "prices[10]"),
    ("md", "Figures come back as PNG images, as Jupyter makes them (SVG too when a cell or --figure-formats asks)."),
    ("code", "import matplotlib.pyplot as plt\n\nfig, ax = plt.subplots(figsize=(4, 2.5))\n"
             "ax.bar(['tea', 'bread', 'cheese'], prices)\nax.set_ylabel('price')\nplt.show()"),
    ("md", "State survives errors: `total` is still here."),
    ("code", "round(total / len(prices), 2)"),
]

RECORDED = [
    ("import math\nradius = 2\narea = math.pi * radius ** 2\nround(area, 3)", None),
    ("print(f'area of a circle of radius {radius}: {area:.2f}')", None),
    ("int('forty-two')", None),
    ("import numpy as np\nimport matplotlib.pyplot as plt\nx = np.linspace(0, 2 * np.pi, 50)\n"
     "fig, ax = plt.subplots(figsize=(4, 2.5))\nax.plot(x, np.sin(x))\nax.set_title('sin')\nplt.show()", None),
    ("import time\ntime.sleep(30)  # longer than this call's timeout of 1 s", 1),
    ("class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n\nPoint(1, 2)", None),
    ("radius * 10  # the interrupted cell did not lose the state", None),
]


async def quickstart(settings_dir: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["kernelexec"] = {"profile": "standard"}
    for kind, source in QUICKSTART:
        if kind == "md":
            nb.cells.append(nbformat.v4.new_markdown_cell(source))
        else:
            tags = ["raises-exception"] if source == "prices[10]" else []
            nb.cells.append(nbformat.v4.new_code_cell(source, metadata={"tags": tags}))
    await replay_notebook(nb, load_settings(state_dir=settings_dir), profile="standard")
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("kernelexec", None)
    nbformat.write(nb, HERE / "quickstart.ipynb")


async def recorded(settings_dir: Path) -> None:
    settings = load_settings(state_dir=settings_dir, pool_size=0)
    sessions = SessionManager(settings)
    async with sessions.running(), Client(build_server(settings, sessions)) as client:
        handle = None
        for code, timeout in RECORDED:
            args = {"code": code} | ({"timeout": timeout} if timeout else {}) | ({"session": handle} if handle else {})
            answer = await client.call_tool("execute_code", args)
            handle = answer.structured_content["session"]
        await client.call_tool("restart_session", {"session": handle, "replay": True})
        await client.call_tool("execute_code", {"code": "area, radius  # rebuilt by replaying cells 1, 2, 4, 6, 7", "session": handle})
        notebook = Path(answer.structured_content["notebook"])
        sessions.sessions[handle].recorder.write_notebook()
    shutil.copyfile(notebook, HERE / "recorded-session.ipynb")


async def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="kxnb"))
    try:
        await quickstart(base / "q")
        await recorded(base / "r")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    anyio.run(main)
