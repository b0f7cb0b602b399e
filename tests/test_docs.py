"""The docs: a README that fits on a screen, and a docs site that builds with every link and anchor resolving.

``mkdocs build --strict`` judges the site: mkdocs.yml's ``validation:`` makes a link to a missing page, a
missing anchor, a page left out of ``nav`` and a link out of ``docs/`` warnings, and ``--strict`` makes every
warning an error. The README is not part of the site, so its links are judged here: each relative link names
a file of the repository, and each ``#anchor`` into a docs page is an id of that page as the site built it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import clean_env

REPO = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def mkdocs_build(source: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(source / "mkdocs.yml"), "-d", str(site)],
                          cwd=source, capture_output=True, text=True, timeout=300, env={**clean_env(), "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    proc = mkdocs_build(REPO, site)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return site


def test_the_docs_site_builds_strict_with_every_page_in_nav(site: Path) -> None:
    for page in sorted((REPO / "docs").glob("*.md")):
        built = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.is_file(), f"{page.name} was not built"
    # ARCHITECTURE.md stays at the root and is included in the site, not copied
    assert "create_manager" in (REPO / "ARCHITECTURE.md").read_text()
    assert "create_manager" in (site / "architecture/index.html").read_text()


@pytest.mark.parametrize("breakage", ["missing-page", "missing-anchor", "page-out-of-docs"])
def test_a_broken_link_or_anchor_in_a_page_fails_the_build(tmp_path: Path, breakage: str) -> None:
    """The judge can fail: a copy of the docs with one broken link does not build."""
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(REPO / "mkdocs.yml", source / "mkdocs.yml")
    shutil.copy(REPO / "ARCHITECTURE.md", source / "ARCHITECTURE.md")
    shutil.copytree(REPO / "docs", source / "docs")
    link = {"missing-page": "[x](no-such-page.md)", "missing-anchor": "[x](security.md#no-such-heading)",
            "page-out-of-docs": "[x](../pyproject.toml)"}[breakage]
    page = source / "docs" / "troubleshooting.md"
    page.write_text(page.read_text() + f"\n{link}\n")
    proc = mkdocs_build(source, tmp_path / "site")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert re.search(r"WARNING .*'troubleshooting\.md'", out), out[-3000:]  # failed for that link, not for another reason


def readme_links() -> list[str]:
    text = re.sub(r"```.*?```", "", (REPO / "README.md").read_text(), flags=re.S)
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def anchors_of(html: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', html))


def test_every_readme_link_names_a_file_and_every_anchor_a_heading(site: Path) -> None:
    links = readme_links()
    assert any(link.startswith("docs/") for link in links) and any("#" in link for link in links)  # control: links were found
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = REPO / path if path else REPO / "README.md"
        if not target.exists():
            broken.append(f"{link}: no such file")
            continue
        if anchor:
            assert target.suffix == ".md" and target.parent == REPO / "docs", f"{link}: anchors are checked in docs pages only"
            built = site / ("index.html" if target.stem == "index" else f"{target.stem}/index.html")
            if anchor not in anchors_of(built.read_text()):
                broken.append(f"{link}: no such anchor")
    assert broken == [], broken


def test_the_readme_fits_on_a_screen() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move the detail to a page under docs/"


def test_the_readme_keeps_its_two_commands() -> None:
    """The first block sets up and starts the server on a fresh machine; the second runs the whole suite."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    assert blocks[0].split("\n")[:3] == ["python3 -m venv .venv && . .venv/bin/activate", "pip install .", "kernelexec serve"], blocks[0]
    assert blocks[1].strip() == "bash .ci/run", blocks[1]
    assert (REPO / ".ci/run").is_file()
