"""Answers as Jupyter and a reading model want them: figures in Jupyter's forms, a short header,
tracebacks that point at the user's code.

- Figures: PNG only by default (as Jupyter); SVG when the code asks (``set_matplotlib_formats``,
  ``%config InlineBackend.figure_formats``) or ``--figure-formats`` says so.
- The header's ``profile=… python=… layers=…`` once per session: the first answer, and whenever
  one of them changes; the structured content always has them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernelexec.models import Execution
from kernelexec.render import Renderer

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


# --- the header --------------------------------------------------------------------------------------


async def test_the_header_says_where_code_runs_once_per_session(harness: Harness) -> None:
    session = await harness.new_session()
    first, second = [await harness.call("execute_code", code="1", session=session) for _ in range(2)]
    head1, head2 = first.content[0].text.splitlines()[0], second.content[0].text.splitlines()[0]
    assert f"session={session}" in head1 and "profile=standard" in head1 and "layers=" in head1
    assert f"session={session}" in head2 and "profile=" not in head2 and "layers=" not in head2
    assert len(head2) < 60, head2
    for answer in (first, second):  # the structured content keeps its fields
        assert answer.structured_content["profile"] == "standard" and answer.structured_content["layers"]


def test_the_header_comes_back_when_what_it_says_changes(tmp_path: Path) -> None:
    renderer = Renderer("s1", tmp_path, result_chars=1000, stream_chars=1000, profile="standard")

    def header(layers: list[str]) -> str:
        return renderer.render(Execution(code="1"), notebook=None, layers=layers).content[0].text.splitlines()[0]

    assert "layers=env+guard" in header(["env", "guard"])
    assert "layers=" not in header(["env", "guard"])
    assert "layers=env" in header(["env"])  # a restart without the guard, say: said again
    assert "profile=" not in header(["env"])
