"""The client configuration snippets (examples/clients/) and the Claude Code marketplace's plugin files are valid.

Each snippet parses, has the shape its client expects (``mcpServers`` everywhere but VS Code's
``servers`` with ``"type": "stdio"``), runs ``kernelexec serve`` with flags that kernelexec's own
parser and settings accept, and the distinct command lines really start a server that lists its tools.
"""

from __future__ import annotations

import filecmp
import json
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from kernelexec.cli import build_parser
from kernelexec.config import Settings, load_settings
from kernelexec.doctor import CLAUDE_PLUGINS
from kernelexec.hook import PLUGIN_NAME, PLUGIN_NAMES, server_tools

from .conftest import clean_env, kernelexec_cmd

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "clients"
CLIENT_FILES = sorted(EXAMPLES.glob("*.json"))
PLUGINS = REPO / "plugins"
PLUGIN_DIRS = [PLUGINS / name for name in PLUGIN_NAMES]
PLUGIN_MCP = PLUGINS / "kernelexec" / ".mcp.json"


def server_entry(path: Path) -> dict[str, Any]:
    """The one kernelexec entry of a client config file, checked for its client's shape."""
    config = json.loads(path.read_text())
    key = "servers" if path.name.startswith("vscode") else "mcpServers"
    assert set(config) <= {key, "inputs"}, f"{path.name}: top-level keys {sorted(config)}"
    servers = config[key]
    assert list(servers) == ["kernelexec"], f"{path.name}: servers {list(servers)}"
    entry = servers["kernelexec"]
    if key == "servers" or "type" in entry:
        assert entry["type"] == "stdio"
    assert set(entry) <= {"type", "command", "args", "env"}
    assert isinstance(entry["command"], str) and entry["command"]
    assert isinstance(entry["args"], list) and all(isinstance(a, str) for a in entry["args"])
    assert isinstance(entry.get("env", {}), dict)
    return entry


def serve_args(command: str, args: list[str]) -> list[str]:
    """The arguments after ``kernelexec``: the command itself, or ``uvx --from PATH kernelexec``."""
    if command == "uvx":
        assert args[0] == "--from" and args[2] == "kernelexec", args
        return args[3:]
    assert Path(command).name == "kernelexec", command
    return args


def check_serve_flags(args: list[str], workspace: Path) -> Settings:
    """kernelexec's own parser and settings accept the flags (client variables filled in)."""
    args = [a.replace("${workspaceFolder}", str(workspace)) for a in args]
    assert re.search(r"\$\{", " ".join(args)) is None, f"unexpanded variable in {args}"
    assert args[0] == "serve"
    parsed = build_parser().parse_args(args)
    overrides = {k: v for k, v in vars(parsed).items() if k in Settings.model_fields and v is not None}
    return load_settings(**overrides)


def test_there_is_a_snippet_for_each_client() -> None:
    names = {p.name for p in CLIENT_FILES}
    assert {"claude_desktop_config.json", "claude-code.mcp.json", "cursor-mcp.json", "vscode-mcp.json"} <= names
    assert (EXAMPLES / "claude-code.sh").exists()


@pytest.mark.parametrize("path", [*CLIENT_FILES, *(d / ".mcp.json" for d in PLUGIN_DIRS)], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_json_snippet_starts_kernelexec_serve_with_valid_flags(path: Path, tmp_path: Path) -> None:
    entry = server_entry(path)
    settings = check_serve_flags(serve_args(entry["command"], entry["args"]), tmp_path)
    assert settings.transport == "stdio"  # every snippet is a stdio server the client starts


def test_vscode_snippet_uses_its_own_format() -> None:
    config = json.loads((EXAMPLES / "vscode-mcp.json").read_text())
    assert "mcpServers" not in config and config["servers"]["kernelexec"]["type"] == "stdio"
    assert "${workspaceFolder}" in config["servers"]["kernelexec"]["args"]


def test_claude_mcp_add_lines_match_the_json_snippets(tmp_path: Path) -> None:
    lines = [line for line in (EXAMPLES / "claude-code.sh").read_text().splitlines() if line.startswith("claude ")]
    assert lines
    project = server_entry(EXAMPLES / "claude-code.mcp.json")
    for line in lines:
        words = shlex.split(line)
        assert words[:3] == ["claude", "mcp", "add"]
        split = words.index("--")
        assert words[split - 1] == "kernelexec"  # the server name, so tools are mcp__kernelexec__*
        command, *args = words[split + 1:]
        check_serve_flags(serve_args(command, args), tmp_path)
        if "--scope" in words and words[words.index("--scope") + 1] == "project":
            assert [command, *args] == [project["command"], *project["args"]]


def distinct_local_commands() -> list[list[str]]:
    seen: list[list[str]] = []
    for path in [*CLIENT_FILES, PLUGIN_MCP]:
        entry = server_entry(path)
        if entry["command"] == "kernelexec" and entry["args"] not in seen:
            seen.append(entry["args"])
    return seen


@pytest.mark.anyio
async def test_the_snippets_command_lines_start_a_working_server(short_tmp: Path) -> None:
    """Each distinct command line, started as its client would (in parallel: each costs a process start)."""
    found: dict[str, set[str]] = {}

    async def start(args: list[str]) -> None:
        workspace = Path(tempfile.mkdtemp(prefix="ws", dir=short_tmp))
        filled = [a.replace("${workspaceFolder}", str(workspace)) for a in args]
        # the state directory beside the workspace, never inside it (serve refuses that: host.check_reach)
        cmd = kernelexec_cmd(*filled, "--state-dir", str(workspace) + "-state")
        params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=clean_env(), cwd=str(workspace))
        async with Client(params) as client:
            found[" ".join(args)] = {t.name for t in (await client.list_tools()).tools}

    commands = distinct_local_commands()
    async with anyio.create_task_group() as tg:
        for args in commands:
            tg.start_soon(start, args)
    assert len(found) == len(commands) >= 3
    for line, tools in found.items():
        assert set(server_tools()) - {"upload_url"} == tools, line  # upload_url: HTTP only


# --- the Claude Code marketplace and its two plugins ---------------------------------------------------------


def test_marketplace_lists_the_two_plugins_in_their_directories() -> None:
    marketplace = json.loads((REPO / ".claude-plugin" / "marketplace.json").read_text())
    assert marketplace["name"] == "kernelexec"  # /plugin install <plugin>@kernelexec
    assert [(p["name"], p["source"]) for p in marketplace["plugins"]] == [(n, f"./plugins/{n}") for n in PLUGIN_NAMES]
    assert set(PLUGIN_NAMES) == set(CLAUDE_PLUGINS)  # the hook and doctor know the same plugins
    assert not (REPO / ".claude-plugin" / "plugin.json").exists()  # the root is the marketplace, not a plugin


@pytest.mark.parametrize("plugin", PLUGIN_DIRS, ids=lambda p: p.name)
def test_plugin_manifests_name_their_plugin_and_declare_author_icon_hosts(plugin: Path) -> None:
    from kernelexec import __version__
    manifest = json.loads((plugin / ".claude-plugin" / "plugin.json").read_text())
    assert manifest["name"] == plugin.name  # tools arrive as mcp__plugin_<name>_kernelexec__*
    assert manifest["version"] == __version__ and re.fullmatch(r"\d+\.\d+\.\d+", manifest["version"])
    assert manifest["description"] and manifest["author"]["name"]
    # a local stdio server and a local hook; the server's installer (install_packages, %pip) reaches pip's
    # index, PyPI unless --index-url/--find-links or pip's own configuration say otherwise
    assert manifest["network"] == {"hosts": ["pypi.org", "files.pythonhosted.org"]}
    icon = plugin / manifest["icon"]
    assert icon.is_file() and not icon.is_symlink()
    png = icon.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width == height and 512 <= width <= 2048 and len(png) < 2_000_000
    servers = json.loads((plugin / ".mcp.json").read_text())["mcpServers"]
    assert list(servers) == [PLUGIN_NAME]  # the server name the hook expects


def test_the_second_plugin_carries_exact_copies_not_links() -> None:
    """Claude Code's validator reads no symlinks and refuses paths outside a plugin, so the
    code-only plugin has copies: refresh them with `cp -r plugins/kernelexec/skills plugins/kernelexec/.mcp.json
    plugins/kernelexec/.claude-plugin/icon.png ...` when the originals change."""
    first, second = PLUGIN_DIRS
    for rel in ("skills", ".mcp.json", ".claude-plugin/icon.png"):
        for path in (first / rel, second / rel):
            assert not path.is_symlink(), path
    compared = filecmp.dircmp(first / "skills", second / "skills")

    def same(c: filecmp.dircmp[str]) -> bool:
        return not (c.left_only or c.right_only or c.diff_files or c.funny_files) and all(same(s) for s in c.subdirs.values())

    assert same(compared) and filecmp.cmp(first / "skills/kernelexec/SKILL.md", second / "skills/kernelexec/SKILL.md", shallow=False)
    for rel in (".mcp.json", ".claude-plugin/icon.png"):
        assert (first / rel).read_bytes() == (second / rel).read_bytes(), rel
    for rel in ("SKILL.md", "references/tools.md", "references/environment.md", "references/recovery.md"):
        assert (first / "skills/kernelexec" / rel).read_bytes() == (second / "skills/kernelexec" / rel).read_bytes(), rel


def test_only_the_code_only_plugin_has_the_hook_and_it_is_on_by_default() -> None:
    assert not (PLUGIN_DIRS[0] / "hooks").exists()
    config = json.loads((PLUGINS / "kernelexec-code-only" / "hooks" / "hooks.json").read_text())
    assert set(config["hooks"]) == {"PreToolUse"}
    (entry,) = config["hooks"]["PreToolUse"]
    assert entry["matcher"] == "*"
    (hook,) = entry["hooks"]
    assert hook["type"] == "command" and "kernelexec hook pre-tool-use --code-only" in hook["command"]
    assert "KERNELEXEC_CODE_ONLY" not in hook["command"]  # no variable needed, none turns it off
    assert "exit 2" in hook["command"]  # fail closed when kernelexec cannot run


def test_skill_has_frontmatter_and_its_references_exist() -> None:
    skill = PLUGIN_DIRS[0] / "skills" / "kernelexec" / "SKILL.md"
    text = skill.read_text()
    match = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert match, "SKILL.md needs YAML frontmatter"
    fields = dict(line.split(": ", 1) for line in match.group(1).splitlines())
    assert fields["name"] == "kernelexec" and len(fields["description"]) < 1024
    links = re.findall(r"\]\((references/[^)]+)\)", text)
    assert 1 <= len(links) <= 3
    for link in links:
        assert (skill.parent / link).is_file(), link
    every = text + "".join((skill.parent / link).read_text() for link in links)
    for tool in server_tools():
        assert tool in every, f"the skill never mentions {tool}"
    for fact in ("interrupted", "restarted", "strict", "standard", "trusted", "PNG", "SVG", "working directory"):
        assert fact in every, fact


def test_the_skill_does_not_depend_on_one_tool_name_prefix() -> None:
    """With a project .mcp.json entry and the plugin both configured, Claude Code keeps one server and
    the prefix changes: the skill names tools bare and says so wherever it shows a prefixed name."""
    skill_dir = PLUGIN_DIRS[0] / "skills" / "kernelexec"
    for path in skill_dir.rglob("*.md"):
        paragraphs = path.read_text().split("\n\n")
        for paragraph in paragraphs:
            if "mcp__" in paragraph:
                assert "prefix" in paragraph and "mcp__kernelexec__" in paragraph and "mcp__plugin_" in paragraph, (path.name, paragraph)
