"""Claude Code itself (npm ``@anthropic-ai/claude-code``, pinned), run as a user would, with no API key.

``.ci/run`` installs it into ``.ci/node``. Without it these tests fail, saying how to install it;
they skip only on a machine without npm (and never in CI). Every run gets a throwaway HOME (the
user's ~/.claude and ~/.claude.json are never read or touched) and Claude Code's switches for no
telemetry, no auto-update and no non-essential traffic: the only process it talks to is the
``kernelexec serve`` it starts, from this checkout's venv.

- ``claude plugin validate`` of the marketplace and of each plugin: no errors, no warnings, no
  plugin-directory findings (``--strict``, and ``--profile directory`` for the plugins).
- ``claude mcp add`` in a fixture project, then ``claude mcp list``: kernelexec connected.
- ``claude --plugin-dir <plugin> mcp list`` for each of the two plugins: the server connected.
- ``claude plugin marketplace add`` + ``claude plugin install``: where Claude Code records the
  plugin, and ``kernelexec doctor`` seeing it next to a project ``.mcp.json`` entry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from kernelexec.doctor import claude_code_registrations, claude_code_report
from kernelexec.hook import PLUGIN_NAMES

from .conftest import clean_env

REPO = Path(__file__).resolve().parent.parent
CLAUDE_VERSION = "2.1.332"  # keep in step with .ci/run
INSTALL = f"npm install --prefix .ci/node @anthropic-ai/claude-code@{CLAUDE_VERSION}"
PLUGINS = {name: REPO / "plugins" / name for name in PLUGIN_NAMES}
QUIET = {"DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
         "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1"}


@pytest.fixture(scope="module")
def claude() -> str:
    local = REPO / ".ci" / "node" / "node_modules" / ".bin" / "claude"
    if local.exists():
        return str(local)
    message = f"Claude Code's CLI is not installed; run `{INSTALL}` in the repository (needs node and npm)"
    if shutil.which("npm") is None and not os.environ.get("CI"):
        pytest.skip(message)  # only without npm; .ci/run installs it
    pytest.fail(message)


@pytest.fixture(scope="module")
def kernelexec_bin() -> str:
    """The directory of this checkout's ``kernelexec`` console script (the venv's bin)."""
    found = shutil.which("kernelexec", path=os.path.dirname(sys.executable))
    assert found, f"no kernelexec script next to {sys.executable}: pip install -e . in the venv"
    return os.path.dirname(found)


@pytest.fixture
def short(short_tmp: Path) -> Path:
    """A per-test directory with a short path: the server's sockets live under HOME, and unix socket
    paths must stay under 107 bytes (pytest's tmp_path is too long for that)."""
    return Path(tempfile.mkdtemp(prefix="cc", dir=short_tmp))


def claude_env(home: Path, kernelexec_bin: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if not k.startswith(("ANTHROPIC_", "CLAUDE_", "CLAUDECODE"))}
    env.update(QUIET, HOME=str(home), PATH=os.pathsep.join([kernelexec_bin, "/usr/local/bin", "/usr/bin", "/bin"]))
    env.pop("XDG_CONFIG_HOME", None)
    return env


def run_claude(claude: str, *args: str, home: Path, cwd: Path, kernelexec_bin: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.run([claude, *args], cwd=cwd, env=claude_env(home, kernelexec_bin), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"claude {proc.args[1:]} exited {proc.returncode}\nstdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}"
    return proc.stdout


def test_the_pinned_claude_code_is_the_one_installed(claude: str, short: Path, kernelexec_bin: str) -> None:
    assert CLAUDE_VERSION in ok(run_claude(claude, "--version", home=short / "home", cwd=short, kernelexec_bin=kernelexec_bin))


def validation(claude: str, target: Path, short: Path, kernelexec_bin: str, *flags: str) -> dict[str, Any]:
    proc = run_claude(claude, "plugin", "validate", "--json", "--strict", *flags, str(target),
                      home=short / "home", cwd=REPO, kernelexec_bin=kernelexec_bin)
    report = json.loads(ok(proc))
    assert report["success"] is True and report["strict"] is True, report
    assert report["manifest"]["errors"] == [] and report["manifest"]["warnings"] == [], report["manifest"]
    for part in report["contents"]:
        assert not part.get("errors") and not part.get("warnings"), part
    if report.get("directory"):
        assert report["directory"]["findings"] == [], report["directory"]["findings"]
        assert report["directory"]["failure"] is None
    return report


def test_plugin_validate_passes_the_marketplace_with_no_warnings(claude: str, short: Path, kernelexec_bin: str) -> None:
    report = validation(claude, REPO, short, kernelexec_bin)
    assert report["manifest"]["type"] == "marketplace"
    # the human-readable form too: no warning sign, no "passed with warnings"
    text = ok(run_claude(claude, "plugin", "validate", str(REPO), home=short / "home", cwd=REPO, kernelexec_bin=kernelexec_bin))
    assert "warning" not in text.lower() and "\u26a0" not in text, text
    marketplace = json.loads((REPO / ".claude-plugin" / "marketplace.json").read_text())
    assert {p["name"]: p["source"] for p in marketplace["plugins"]} == {n: f"./plugins/{n}" for n in PLUGIN_NAMES}


@pytest.mark.parametrize("name", PLUGIN_NAMES)
def test_plugin_validate_passes_each_plugin_with_no_warnings(claude: str, short: Path, kernelexec_bin: str, name: str) -> None:
    report = validation(claude, PLUGINS[name], short, kernelexec_bin, "--profile", "directory")
    assert report["manifest"]["type"] == "plugin"
    provides = report["provides"]
    assert [s["name"] for s in provides["mcpServers"]] == ["kernelexec"], provides["mcpServers"]
    assert provides["skills"] == [f"{name}:kernelexec"], provides["skills"]
    assert len(provides["hooks"]) == (1 if name == "kernelexec-code-only" else 0), provides["hooks"]
    assert report["hosts"]["declared"]["plugin"] is True  # network.hosts: [] -- it reaches no host
    text = ok(run_claude(claude, "plugin", "validate", str(PLUGINS[name]), home=short / "home", cwd=REPO, kernelexec_bin=kernelexec_bin))
    assert "warning" not in text.lower() and "\u26a0" not in text, text


def connected(listing: str, server: str) -> bool:
    """``claude mcp list`` prints ``<server>: <command> - ✔ Connected`` per server it health-checked."""
    return any(line.startswith(f"{server}: ") and line.rstrip().endswith("Connected") and "\u2714" in line
               for line in listing.splitlines())


def test_claude_mcp_add_then_mcp_list_reports_kernelexec_connected(claude: str, short: Path, kernelexec_bin: str) -> None:
    """The README's line, in a fixture project; local scope lands in the temp HOME's ~/.claude.json."""
    home, project = short / "home", short / "project"
    project.mkdir()
    add = ["mcp", "add", "kernelexec", "--", "kernelexec", "serve", "--profile", "standard", "--working-dir", "."]
    ok(run_claude(claude, *add, home=home, cwd=project, kernelexec_bin=kernelexec_bin))
    listing = ok(run_claude(claude, "mcp", "list", home=home, cwd=project, kernelexec_bin=kernelexec_bin))
    assert connected(listing, "kernelexec"), listing
    assert "plugin:" not in listing  # nothing else configured: the user's own config is not read
    registrations, plugins = claude_code_registrations(project, home)
    assert registrations == ["kernelexec in ~/.claude.json (local scope, claude mcp add)"] and plugins == []


def test_each_plugin_dir_starts_a_connected_server(claude: str, short: Path, kernelexec_bin: str) -> None:
    """``claude --plugin-dir plugins/<name> mcp list``, one after the other (each ~6 s)."""
    def listing(name: str) -> str:
        n = PLUGIN_NAMES.index(name)
        (short / f"p{n}").mkdir()
        return ok(run_claude(claude, "--plugin-dir", str(PLUGINS[name]), "mcp", "list",
                             home=short / f"h{n}", cwd=short / f"p{n}", kernelexec_bin=kernelexec_bin))

    listings = {name: listing(name) for name in PLUGIN_NAMES}
    for name, text in listings.items():
        assert connected(text, f"plugin:{name}:kernelexec"), text


def test_marketplace_install_is_where_doctor_looks_and_a_duplicate_is_reported(claude: str, short: Path, kernelexec_bin: str) -> None:
    """The README's /plugin lines as CLI commands (local marketplace: no network); doctor then sees the
    plugin, and warns once the project's .mcp.json also registers kernelexec."""
    home, project = short / "home", short / "project"
    project.mkdir()
    run = lambda *args: ok(run_claude(claude, *args, home=home, cwd=project, kernelexec_bin=kernelexec_bin))  # noqa: E731
    run("plugin", "marketplace", "add", str(REPO))
    run("plugin", "install", "kernelexec-code-only@kernelexec", "--scope", "project")
    assert "kernelexec-code-only@kernelexec" in run("plugin", "list")
    assert json.loads((project / ".claude" / "settings.json").read_text())["enabledPlugins"] == {"kernelexec-code-only@kernelexec": True}
    assert claude_code_registrations(project, home) == ([], ["kernelexec-code-only@kernelexec (.claude/settings.json)"])
    assert not any("WARNING" in line for line in claude_code_report(project, home))

    shutil.copy(PLUGINS["kernelexec"] / ".mcp.json", project / ".mcp.json")
    report = "\n".join(claude_code_report(project, home))
    assert f"kernelexec in {project.resolve() / '.mcp.json'}" in report and "WARNING: kernelexec is configured more than once" in report
    proc = subprocess.run([os.path.join(kernelexec_bin, "kernelexec"), "doctor"], cwd=project, capture_output=True, text=True,
                          timeout=120, env=clean_env(HOME=str(home)))
    assert proc.returncode == 0 and "configured more than once" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


# --- doctor's reading of Claude Code's files, without Claude Code -----------------------------------------


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_doctor_tolerates_missing_and_malformed_files(short: Path) -> None:
    home, project = short / "home", short / "project"
    project.mkdir()
    assert claude_code_registrations(project, home) == ([], [])
    write(project / ".mcp.json", "{not json")
    write(home / ".claude.json", '{"projects": [1, 2], "mcpServers": "x"}')
    write(home / ".claude" / "settings.json", '{"enabledPlugins": ["kernelexec@kernelexec"]}')
    write(project / ".claude" / "settings.json", "[]")
    (project / ".claude" / "settings.local.json").mkdir()
    assert claude_code_registrations(project, home) == ([], [])
    write(project / ".mcp.json", '{"mcpServers": {"kernelexec": "nonsense", "other": {"command": "node"}}}')
    assert claude_code_registrations(project, home) == ([], [])  # not a server entry; not kernelexec
    write(project / ".mcp.json", '{"mcpServers": {"kernelexec": {"command": "kernelexec", "args": "serve"}}}')
    assert claude_code_registrations(project, home) == ([f"kernelexec in {project.resolve() / '.mcp.json'}"], [])


def test_doctor_reads_every_scope_and_later_settings_override(short: Path) -> None:
    home, project = short / "home", short / "project"
    project.mkdir()
    write(project / ".mcp.json", json.dumps({"mcpServers": {"py": {"command": "uvx", "args": ["--from", ".", "kernelexec", "serve"]}}}))
    write(home / ".claude.json", json.dumps({"mcpServers": {"kx": {"command": "/opt/bin/kernelexec", "args": ["serve"]}},
                                             "projects": {str(project.resolve()): {"mcpServers": {"kernelexec": {"command": "kernelexec"}}}}}))
    write(home / ".claude" / "settings.json", json.dumps({"enabledPlugins": {"kernelexec@kernelexec": True, "other@x": True}}))
    write(project / ".claude" / "settings.local.json", json.dumps({"enabledPlugins": {"kernelexec@kernelexec": False}}))
    registrations, plugins = claude_code_registrations(project, home)
    assert registrations == [f"py in {project.resolve() / '.mcp.json'}", "kernelexec in ~/.claude.json (local scope, claude mcp add)",
                             "kx in ~/.claude.json (user scope)"]
    assert plugins == []  # disabled in settings.local.json, which wins
    assert "WARNING" in "\n".join(claude_code_report(project, home))
