"""Answers as Jupyter and a reading model want them: figures in Jupyter's forms, a short header,
tracebacks that point at the user's code.

- Figures: PNG only by default (as Jupyter); SVG when the code asks (``set_matplotlib_formats``,
  ``%config InlineBackend.figure_formats``) or ``--figure-formats`` says so.
- The header's ``profile=… python=… layers=…`` once per session: the first answer, and whenever
  one of them changes; the structured content always has them.
- Tracebacks without kernelexec's own frames (the guard's): a refusal or a missing module points at
  the user's line; a missing module gets one line on how to install it here, or why not.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernelexec.kernel.execution import CellError, Execution
from kernelexec.server.render import Renderer
from kernelexec.session.hints import install_hint

from .conftest import Harness, make_settings, serving

pytestmark = pytest.mark.anyio

MISSING = "kxmissingpkg"  # allowed by name in the fixtures below, installed nowhere
STARTUP = str(Path(__file__).resolve().parents[1] / "startup")
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
async def configured(short_tmp: Path) -> AsyncIterator[Harness]:
    """standard, with --figure-formats png,svg and a module it allows that is not installed."""
    settings = make_settings(short_tmp, figure_formats="png,svg", allow_imports=[MISSING], pool_size=0, restart_spares=0)
    async with serving(settings) as h:
        yield h


async def test_the_figure_formats_setting_answers_what_it_names(configured: Harness) -> None:
    assert configured.settings.figure_formats == ["png", "svg"]
    assert mimes(await configured.run(PLOT)) == ["image/png", "image/svg+xml"]


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


# --- tracebacks ----------------------------------------------------------------------------------------


def no_kernelexec_frames(answer: dict) -> None:
    shown = "\n".join(answer["traceback"])
    assert "guard.py" not in shown and STARTUP not in shown and "startup/" not in shown, shown


async def test_a_refused_import_points_at_the_users_line(harness: Harness) -> None:
    answer = await harness.run("x = 1\nimport subprocess", session=await harness.new_session())
    assert answer["error"].startswith("ImportError: Import of subprocess is not allowed")
    no_kernelexec_frames(answer)
    assert "----> 2 import subprocess" in "\n".join(answer["traceback"])
    assert answer["traceback"][-1].startswith("ImportError: Import of subprocess")  # no install line for a stdlib module


async def test_a_refused_write_and_a_refusal_inside_a_function_point_at_the_user(harness: Harness) -> None:
    session = await harness.new_session()
    answer = await harness.run("open('/etc/kx-nope', 'w')", session=session)
    assert answer["error_type"] == "PolicyError"
    no_kernelexec_frames(answer)
    answer = await harness.run("def load():\n    import socket\n\nload()", session=session)
    no_kernelexec_frames(answer)
    shown = "\n".join(answer["traceback"])
    assert "----> 4 load()" in shown and "----> 2     import socket" in shown


async def test_a_missing_module_names_the_way_to_install_it(configured: Harness) -> None:
    answer = await configured.run(f"import math\nimport {MISSING}")
    assert answer["error"] == f"ModuleNotFoundError: No module named '{MISSING}'"
    no_kernelexec_frames(answer)
    assert f"----> 2 import {MISSING}" in "\n".join(answer["traceback"])
    hint = answer["traceback"][-1]
    assert hint == (f'kernelexec: to install it here: the install_packages tool (packages=["{MISSING}"]) or a line '
                    f"`%pip install {MISSING}` in a cell; it is importable at once")
    notebook = json.loads(Path(answer["notebook"]).read_text())
    assert "kernelexec:" not in json.dumps(notebook["cells"][-1]["outputs"])  # the record keeps the kernel's own words


async def test_a_refused_module_that_is_no_stdlib_says_an_install_would_allow_it(harness: Harness) -> None:
    answer = await harness.run("import kxnotallowed", session=await harness.new_session())
    no_kernelexec_frames(answer)
    assert answer["traceback"][-1].startswith("kernelexec: if kxnotallowed is a package, installing it here allows it: "
                                              'the install_packages tool (packages=["kxnotallowed"])')


@pytest.fixture(scope="module")
async def safe_off(short_tmp: Path) -> AsyncIterator[Harness]:
    """The safe-executor preset (strict: installs off), allowing a module that is not installed."""
    async with serving(make_settings(short_tmp, preset="safe-executor", allow_imports=[MISSING], pool_size=0,
                                     restart_spares=0)) as h:
        yield h


async def test_with_installs_off_a_missing_module_says_so_and_why(safe_off: Harness) -> None:
    failed = await safe_off.call("run_python", code=f"import {MISSING}")
    assert failed.is_error
    text = failed.content[0].text
    assert f"ModuleNotFoundError: No module named '{MISSING}'" in text.splitlines()[0]
    assert "guard.py" not in text and STARTUP not in text
    assert text.splitlines()[-1] == (f"kernelexec: {MISSING} cannot be installed here: installing packages is off in the "
                                     "'strict' profile (--install-policy off); ask the user to install it into the kernel's environment")
    refused = (await safe_off.call("run_python", code="import os")).content[0].text
    assert "guard.py" not in refused and STARTUP not in refused and "kernelexec:" not in refused


def test_the_install_line_follows_the_install_policy(tmp_path: Path) -> None:
    missing = CellError("ModuleNotFoundError", "No module named 'sklearn.linear_model'")
    allowlist = make_settings(tmp_path, install_policy="allowlist", install_allow=["pandas"])
    assert install_hint(allowlist, "standard", missing, local_kernel=True) == (
        "kernelexec: scikit-learn cannot be installed here: not on the install allowlist (--install-allow): "
        "scikit-learn; allowed: pandas")
    plugin = make_settings(tmp_path, preset="plugin")
    assert install_hint(plugin, "trusted", missing, local_kernel=True) == (
        "kernelexec: to install it here: a line `%pip install scikit-learn` in a cell; it is importable at once")
    assert "remote kernel's image" in str(install_hint(make_settings(tmp_path), "standard", missing, local_kernel=False))
    assert install_hint(make_settings(tmp_path), "standard", CellError("ModuleNotFoundError", "No module named 'tomllib'"),
                        local_kernel=True) is None  # stdlib: nothing to install
    assert install_hint(make_settings(tmp_path), "standard", CellError("ValueError", "No module named 'x'"), local_kernel=True) is None
    refused = CellError("ImportError", "Import of numpy is not allowed in the 'strict' profile. Allowed modules: math")
    assert install_hint(make_settings(tmp_path), "strict", refused, local_kernel=True) is None  # installs off: no line
    assert str(install_hint(make_settings(tmp_path, install_policy="any"), "strict", refused, local_kernel=True)).startswith(
        "kernelexec: if numpy is a package, installing it here allows it")
