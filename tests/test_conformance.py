"""The official MCP conformance suite (``@modelcontextprotocol/conformance``) against ``kernelexec serve --transport http``.

Every server scenario the suite's CLI lists (``conformance list --server``) runs against one real HTTP server;
a scenario passes when the CLI exits 0 and none of its checks (``checks.json``) is a FAILURE. The scenarios
expected to fail are in ``tests/conformance-expected-failures.txt``, each with its reason (mostly: it needs the
suite's own fixture tools, prompts or resources). An unexpected failure fails this test, and so does an
expected failure that passes or one the suite no longer lists, so that file stays honest.

Note: tools-call-simple-text passes without its fixture tool ``test_simple_text``: the suite only checks that
the answer has text content, and "Unknown tool: test_simple_text" is text. It is kept as the suite judges it.

The suite (0.1.16) imports ``fs.globSync`` and so needs Node 22; ``.ci/run`` installs a pinned Node 22 from
npm (the ``node`` package, which ships the official binary) next to the suite in ``.ci/node22``. Without them
this test fails in CI (``CI`` set) or wherever npm is present, and skips only on a machine without npm.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import clean_env, http_server

REPO = Path(__file__).resolve().parent.parent
CONFORMANCE_VERSION = "0.1.16"  # keep in step with .ci/run
NODE_VERSION = "22.23.3"  # keep in step with .ci/run
PREFIX = REPO / ".ci" / "node22"
INSTALL = (f"npm install --prefix .ci/node22 node@{NODE_VERSION} "
           f"@modelcontextprotocol/conformance@{CONFORMANCE_VERSION}")
EXPECTED = Path(__file__).resolve().parent / "conformance-expected-failures.txt"

pytestmark = pytest.mark.slow  # about 30 scenarios, ~25 s


def expected_failures() -> dict[str, str]:
    """scenario -> reason, from the expected-failures file ("scenario: reason" lines, # comments)."""
    out: dict[str, str] = {}
    for line in EXPECTED.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, reason = line.partition(":")
        assert sep and reason.strip(), f"{EXPECTED.name}: every line is 'scenario: reason', not {line!r}"
        assert name.strip() not in out, f"{EXPECTED.name}: {name.strip()} listed twice"
        out[name.strip()] = reason.strip()
    return out


@pytest.fixture(scope="module")
def conformance() -> list[str]:
    """The command that runs the suite's CLI: the pinned Node 22 and the pinned suite."""
    node = PREFIX / "node_modules" / "node" / "bin" / "node"
    cli = PREFIX / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    if not (node.exists() and cli.exists()):
        message = f"the MCP conformance suite or its Node 22 is not installed; run `{INSTALL}` in the repository (needs npm)"
        if shutil.which("npm") is None and not os.environ.get("CI"):
            pytest.skip(message)  # only without npm; .ci/run installs it
        pytest.fail(message)
    version = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=30)
    assert version.stdout.strip() == f"v{NODE_VERSION}", (version.stdout, version.stderr)
    package = json.loads((cli.parent.parent / "package.json").read_text())
    assert package["version"] == CONFORMANCE_VERSION, package["version"]
    return [str(node), str(cli)]


def server_scenarios(conformance: list[str]) -> list[str]:
    done = subprocess.run([*conformance, "list", "--server"], capture_output=True, text=True, timeout=60,
                          env=clean_env(NO_COLOR="1"))
    assert done.returncode == 0, done.stderr
    names = re.findall(r"^\s+- (\S+)", done.stdout, re.M)
    assert len(names) >= 20, f"too few server scenarios listed: {done.stdout}"
    return names


def run_scenario(conformance: list[str], url: str, scenario: str, out: Path) -> tuple[bool, str]:
    """(passed, why): the CLI's exit code and the checks it wrote."""
    out.mkdir(parents=True)
    done = subprocess.run([*conformance, "server", "--url", url, "--scenario", scenario, "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env=clean_env(NO_COLOR="1"),
                          stdin=subprocess.DEVNULL)
    found = list(out.glob("*/checks.json"))
    if len(found) != 1:
        return False, f"exit {done.returncode}, no checks.json: {done.stdout[-800:]} {done.stderr[-800:]}"
    checks = json.loads(found[0].read_text())
    failed = [f"{c.get('id')}: {c.get('errorMessage')}" for c in checks if c.get("status") == "FAILURE"]
    passed = done.returncode == 0 and bool(checks) and not failed
    return passed, "; ".join(failed) or f"exit {done.returncode}, {len(checks)} checks"


def test_conformance_server_scenarios(conformance: list[str], short_tmp: Path) -> None:
    expected = expected_failures()
    scenarios = server_scenarios(conformance)
    stale = sorted(set(expected) - set(scenarios))
    results: dict[str, tuple[bool, str]] = {}
    with http_server(short_tmp / "conf-state") as url:
        for i, scenario in enumerate(scenarios):
            results[scenario] = run_scenario(conformance, url, scenario, short_tmp / f"conf-out-{i}")
    unexpected_failures = {s: why for s, (ok, why) in results.items() if not ok and s not in expected}
    unexpected_passes = sorted(s for s, (ok, _) in results.items() if ok and s in expected)
    passing = sorted(s for s, (ok, _) in results.items() if ok)
    assert not unexpected_failures and not unexpected_passes and not stale, (
        f"unexpected failures: {unexpected_failures}\n"
        f"expected failures that now pass (remove them from {EXPECTED.name}): {unexpected_passes}\n"
        f"expected failures the suite no longer lists: {stale}\n"
        f"passing: {passing}"
    )
    # the measured floor of issue 34: these pass, whatever the expected-failures file says
    for scenario in ("server-initialize", "ping", "tools-list", "tools-call-error", "server-sse-multiple-streams",
                     "resources-list", "prompts-list", "dns-rebinding-protection"):
        assert results[scenario][0], (scenario, results[scenario][1])
