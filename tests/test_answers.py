"""Answers as Jupyter and a reading model want them: figures in Jupyter's forms, a short header,
tracebacks that point at the user's code.

- Figures: PNG only by default (as Jupyter); SVG when the code asks (``set_matplotlib_formats``,
  ``%config InlineBackend.figure_formats``) or ``--figure-formats`` says so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from .conftest import Harness, make_settings, serving

pytestmark = pytest.mark.anyio

PLOT = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 3, 2])\nplt.show()"


def mimes(answer: dict) -> list[str]:
    return sorted(o["mime_type"] for o in answer["outputs"])


# --- figures ---------------------------------------------------------------------------------------


async def test_a_plot_answers_png_only_by_default(harness: Harness) -> None:
    answer = await harness.run(PLOT, session=await harness.new_session())
    assert answer["success"], answer["error"]
    assert mimes(answer) == ["image/png"]


async def test_set_matplotlib_formats_svg_answers_svg(harness: Harness) -> None:
    session = await harness.new_session()
    code = "from matplotlib_inline.backend_inline import set_matplotlib_formats\nset_matplotlib_formats('svg')\n" + PLOT
    answer = await harness.run(code, session=session)
    assert mimes(answer) == ["image/svg+xml"]
    assert "<svg" in Path(answer["outputs"][0]["path"]).read_text()[:2000]
    assert mimes(await harness.run(PLOT, session=session)) == ["image/svg+xml"]  # the choice stays for the session


async def test_config_figure_formats_answers_both(harness: Harness) -> None:
    code = "%config InlineBackend.figure_formats = ['png', 'svg']\n" + PLOT
    assert mimes(await harness.run(code, session=await harness.new_session())) == ["image/png", "image/svg+xml"]


@pytest.fixture(scope="module")
async def svg_too(short_tmp: Path) -> AsyncIterator[Harness]:
    async with serving(make_settings(short_tmp, figure_formats="png,svg", pool_size=0, restart_spares=0)) as h:
        yield h


async def test_the_figure_formats_setting_answers_what_it_names(svg_too: Harness) -> None:
    assert svg_too.settings.figure_formats == ["png", "svg"]
    assert mimes(await svg_too.run(PLOT)) == ["image/png", "image/svg+xml"]
