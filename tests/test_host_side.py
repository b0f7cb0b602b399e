"""The host side: nothing a kernel can write is ever run, imported or trusted outside the sandbox.

Each test is the attack: a cell (or, standing in for one, the test writing where a cell can) plants a
file in the working directory; then what used to run it on the host runs — a new session, the next
``serve``, ``doctor``, ``replay``, the user's ``git status``. The judge is a canary file that only code
running on the host can create: it lies in the test's own temporary directory, which no kernel can
reach (bubblewrap gives kernels a private /tmp and Landlock grants nothing there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from kernelexec import host
from kernelexec.sandbox.probe import kernel_reach, probe

from .conftest import clean_env, kernelexec_cmd, make_settings, serving

pytestmark = pytest.mark.anyio


def require_bwrap() -> None:
    if probe().bwrap is None:
        pytest.fail("these tests need bubblewrap (CI installs it; see .ci/run)")


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Path]:
    """A path only host-side code can write; asserted absent by each test (and shown writable by the test itself)."""
    path = tmp_path / "outside" / "CANARY"
    path.parent.mkdir()
    path.parent.chmod(0o777)
    probe_file = path.parent / "probe"
    probe_file.write_text("the test process can write here")  # positive control: the place is writable from the host
    assert probe_file.read_text()
    yield path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "proj"
    path.mkdir()
    (path / "pyproject.toml").write_text('[project]\nname = "proj"\nversion = "0"\n')
    return path


def planted_python(canary: Path) -> str:
    """A "Python" that proves it ran: writes the canary, then behaves as a real interpreter."""
    return f"#!/bin/sh\necho ran \"$@\" >> {canary}\nexec {sys.executable} \"$@\"\n"


PLANT_VENV = """
import os, json
data = json.loads({data!r})
root = os.getcwd()
site = os.path.join(root, '.venv', 'lib', 'python3.11', 'site-packages')
os.makedirs(os.path.join(root, '.venv', 'bin'), exist_ok=True)
os.makedirs(site, exist_ok=True)
with open(os.path.join(root, '.venv', 'pyvenv.cfg'), 'w') as f:
    f.write('home = ' + data['home'] + '\\nversion = 3.11.7\\n')
python = os.path.join(root, '.venv', 'bin', 'python3')
if data['script']:
    with open(python, 'w') as f:
        f.write(data['script'])
    os.chmod(python, 0o755)
else:
    os.symlink(data['real'], python)
with open(os.path.join(site, 'evil.pth'), 'w') as f:
    f.write(data['pth'])
result = sorted(os.listdir(os.path.join(root, '.venv')))
"""


def plant_venv_cell(canary: Path, secret_dir: Path, project: Path, kind: str) -> str:
    pth = f"{secret_dir}\nimport os; open({str(canary)!r}, 'a').write('pth ran')\n"
    real = os.path.realpath(sys.executable)
    data = {"script": planted_python(canary) if kind == "script" else "", "real": real, "pth": pth,
            "home": str(project / ".venv" / "bin") if kind == "script" else os.path.dirname(real)}
    return PLANT_VENV.format(data=json.dumps(data))


@pytest.mark.parametrize("kind", ["script", "real-interpreter-and-pth"])
@pytest.mark.slow
async def test_a_venv_a_cell_plants_is_never_run_by_new_sessions_serve_doctor_or_replay(
        kind: str, short_tmp: Path, tmp_path: Path, project: Path, canary: Path) -> None:
    """A cell's .venv/bin/python3 (a script, or the real interpreter with a .pth of code and of a
    host directory) would run on the host at the next probe, and widen what the next kernel reads."""
    require_bwrap()
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (secret / "key").write_text("s3cret")
    settings = make_settings(short_tmp, working_dir=project, pool_size=0, restart_spares=0)
    async with serving(settings) as h:
        a = await h.run(plant_venv_cell(canary, secret, project, kind))
        assert a["success"] and a["result"] == ["bin", "lib", "pyvenv.cfg"], a["error"]  # the cell could plant it
        # a new session: auto-detection refuses the .venv that appeared while kernels ran
        second = await h.client.call_tool("new_session", {})
        if not second.is_error:
            answer = await h.client.call_tool("execute_code", {"code": "1", "session": second.structured_content["session"]})
            assert answer.is_error, answer
            text = answer.content[0].text
        else:
            text = second.content[0].text
        assert "--python" in text and ".venv" in text, text
    assert not canary.exists(), canary.read_text()

    # the next start, in a fresh process (the .venv is there from its start now): nothing of it runs on
    # the host; the kernel never reads the host directory the .pth names
    read = f"print(open({str(secret / 'key')!r}).read())"
    out = subprocess.run(kernelexec_cmd("exec", read, "--working-dir", str(project), "--state-dir", str(short_tmp / f"s-{kind}"),
                                        "--pool-size", "0", "--restart-spares", "0"),
                         capture_output=True, text=True, timeout=300, cwd=project, env=clean_env())
    assert "s3cret" not in out.stdout, out.stdout
    if kind == "script":  # its interpreter lies in the project: refused, saying so
        assert out.returncode != 0 and ".venv" in out.stderr and "Traceback" not in out.stderr, out.stderr
    else:
        assert "PermissionError" in out.stdout + out.stderr or "not allowed" in out.stdout + out.stderr, (out.stdout, out.stderr)
    assert not canary.exists(), canary.read_text()

    doctor = subprocess.run(kernelexec_cmd("doctor", "--working-dir", str(project), "--state-dir", str(short_tmp / "s-doc")),
                            capture_output=True, text=True, timeout=120, cwd=project, env=clean_env())
    assert "kernelexec doctor" in doctor.stdout, doctor.stderr
    assert not canary.exists(), canary.read_text()

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    nb_path = tmp_path / "n.ipynb"
    nbformat.write(nb, nb_path)
    subprocess.run(kernelexec_cmd("replay", str(nb_path), "--working-dir", str(project), "--state-dir", str(short_tmp / "s-rep")),
                   capture_output=True, text=True, timeout=300, cwd=project, env=clean_env())
    assert not canary.exists(), canary.read_text()


@pytest.mark.slow
def test_the_servers_helpers_never_import_a_planted_module_from_its_working_directory(
        short_tmp: Path, project: Path, canary: Path) -> None:
    """`python -c` helpers put the cwd first on sys.path; the server runs in the project."""
    for name in ("json", "os", "ctypes", "sysconfig", "platform", "site", "encodings", "pip"):
        (project / f"{name}.py").write_text(f"open({str(canary)!r}, 'a').write('{name} imported\\n')\n")
    (project / "pip").mkdir()
    (project / "pip" / "__main__.py").write_text(f"open({str(canary)!r}, 'a').write('pip ran\\n')\n")
    # the console script, as Claude Code starts it in the project (``python -m`` would put the cwd on the
    # server's own path: the user's choice of launcher, not a helper of ours)
    script = str(Path(sys.executable).parent / "kernelexec")
    doctor = subprocess.run([script, "doctor", "--working-dir", str(project), "--state-dir", str(short_tmp / "s-j")],
                            capture_output=True, text=True, timeout=120, cwd=project, env=clean_env())
    assert "kernelexec doctor" in doctor.stdout, doctor.stderr
    out = subprocess.run([script, "exec", "import json; print(json.dumps([1]))", "--working-dir", str(project),
                                        "--state-dir", str(short_tmp / "s-j2"), "--pool-size", "0"],
                         capture_output=True, text=True, timeout=180, cwd=project, env=clean_env())
    assert "[1]" in out.stdout, (out.stdout, out.stderr)
    assert not canary.exists(), canary.read_text()


GIT_ATTACKS = {
    ".git/config": "[core]\n\tfsmonitor = sh -c 'echo fsmonitor >> {canary}'\n",
    ".git/hooks/post-checkout": "#!/bin/sh\necho hook >> {canary}\n",
    ".git/hooks/pre-commit": "#!/bin/sh\necho hook >> {canary}\n",
    ".claude/settings.json": '{{"hooks": {{"SessionStart": [{{"hooks": [{{"type": "command", "command": "echo x >> {canary}"}}]}}]}}}}',
    ".vscode/tasks.json": '{{"version": "2.0.0", "tasks": [{{"label": "x", "command": "echo x >> {canary}", "runOptions": {{"runOn": "folderOpen"}}}}]}}',
    ".idea/workspace.xml": "<project/>",
    ".direnv/x": "x",
    ".mcp.json": '{{"mcpServers": {{"x": {{"command": "sh", "args": ["-c", "echo x >> {canary}"]}}}}}}',
    ".envrc": "echo x >> {canary}\n",
    ".gitmodules": "[submodule \"x\"]\n\tpath = x\n\turl = ./x\n",
    "secrets.txt": "overwritten",
}

ATTACK_CELL = """
import os, json
results = {{}}
for rel, text in json.loads({attacks!r}).items():
    path = os.path.join(os.getcwd(), rel)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
            f.write(text)
        results[rel] = 'written'
    except OSError as exc:
        results[rel] = type(exc).__name__
try:
    open('ordinary.txt', 'w').write('fine')
    results['ordinary.txt'] = 'written'
except OSError as exc:
    results['ordinary.txt'] = type(exc).__name__
result = results
"""


@pytest.mark.parametrize("existing", [True, False], ids=["in-a-git-repo", "nothing-there-yet"])
async def test_a_cell_cannot_plant_what_git_claude_code_and_editors_run(
        existing: bool, short_tmp: Path, project: Path, canary: Path) -> None:
    """.git/config fsmonitor, hooks, .claude/, .vscode/, .mcp.json, .envrc in a writable project,
    whether they exist yet or not; `git status` on the host afterwards runs nothing planted."""
    require_bwrap()
    if existing:
        subprocess.run(["git", "init", "-q", str(project)], check=True)
        for rel in (".mcp.json", ".envrc", ".gitmodules"):
            (project / rel).write_text("")
    (project / "secrets.txt").write_text("original")
    attacks = {k: v.format(canary=canary) for k, v in GIT_ATTACKS.items()}
    settings = make_settings(short_tmp, working_dir=project, pool_size=0, restart_spares=0, profile="trusted", protect=["secrets*"])
    async with serving(settings) as h:
        a = await h.run(ATTACK_CELL.format(attacks=json.dumps(attacks)))
    results: dict[str, Any] = a["result"]
    assert results["ordinary.txt"] == "written", results  # positive control: the working directory is writable
    must_fail = [".git/config", ".git/hooks/post-checkout", ".git/hooks/pre-commit", ".claude/settings.json",
                 ".vscode/tasks.json", ".idea/workspace.xml", ".direnv/x", "secrets.txt"]
    if existing:
        must_fail += [".mcp.json", ".envrc", ".gitmodules"]
    assert all(results[rel] != "written" for rel in must_fail), results
    assert (project / "secrets.txt").read_text() == "original"
    if not existing:
        subprocess.run(["git", "init", "-q", str(project)], check=True, capture_output=True)
    # the user's next git commands, on the host
    env = {**clean_env(), "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(project.parent)}
    subprocess.run(["git", "status"], cwd=project, capture_output=True, timeout=60, env=env)
    subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "x"],
                   cwd=project, capture_output=True, timeout=60, env=env)
    assert not canary.exists(), canary.read_text()


def test_placeholders_are_empty_directories_that_git_walks_past(tmp_path: Path) -> None:
    """A missing protected directory becomes an empty one (so bubblewrap can bind it read-only); git in a
    subdirectory of a repository still finds the repository above it."""
    repo = tmp_path / "repo"
    sub = repo / "sub"
    sub.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    existing, missing = host.protected_paths(sub)
    assert existing == [] and {p.name for p in missing} == set(host.PROTECTED_DIRS)
    assert host.make_placeholders(missing) == []
    assert all(p.is_dir() and not any(p.iterdir()) for p in missing)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=sub, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr


@pytest.mark.parametrize("where", ["home", "state-inside", "inside-state", "cache-inside"])
def test_a_working_directory_that_reaches_kernelexecs_own_state_or_your_home_is_refused_at_start(
        where: str, short_tmp: Path) -> None:
    """Claude Code started in ~ with --working-dir . exposed every session's secrets."""
    tmp_path = Path(tempfile.mkdtemp(prefix="r", dir=short_tmp))
    home = tmp_path / "home"
    home.mkdir()
    state = home / ".local" / "state" / "kernelexec"
    cache = tmp_path / "cache"
    working = {"home": home, "state-inside": home, "inside-state": state / "sessions", "cache-inside": tmp_path}[where]
    if where == "state-inside":
        working = home / ".local"
    working.mkdir(parents=True, exist_ok=True)
    env = clean_env(HOME=str(home))
    proc = subprocess.run(kernelexec_cmd("serve", "--working-dir", str(working), "--state-dir", str(state), "--cache-dir", str(cache)),
                          capture_output=True, text=True, timeout=120, cwd=working, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0, (proc.returncode, proc.stderr)
    message = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert ("home directory" in message) if where == "home" else ("overlap" in message or "home directory" in message), message


@pytest.mark.parametrize("where", ["shared-inside-work", "work-inside-shared", "key-inside-work"])
def test_a_shared_dir_or_state_key_file_within_a_kernels_reach_is_refused_at_start(where: str, short_tmp: Path) -> None:
    """--shared-dir holds every session's directory and --state-key-file the keys that seal every replica's request
    state: a kernel that can reach either reads other sessions' files or forges their retries."""
    tmp_path = Path(tempfile.mkdtemp(prefix="s", dir=short_tmp))
    work = tmp_path / "work"
    work.mkdir()
    key = tmp_path / "state.key"
    shared = tmp_path / "shared"
    if where == "shared-inside-work":
        shared = work / "shared"
    elif where == "work-inside-shared":
        work = shared / "project"
        work.mkdir(parents=True)
    else:
        key = work / "state.key"
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o600)
    shared.mkdir(exist_ok=True)
    proc = subprocess.run(kernelexec_cmd("serve", "--working-dir", str(work), "--state-dir", str(tmp_path / "state"),
                                         "--cache-dir", str(tmp_path / "cache"), "--shared-dir", str(shared),
                                         "--state-key-file", str(key)),
                          capture_output=True, text=True, timeout=120, cwd=work, env=clean_env(HOME=str(tmp_path)),
                          stdin=subprocess.DEVNULL)
    assert proc.returncode != 0, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert "overlap" in message and ("--shared-dir" in message or "--state-key-file" in message), message


def test_a_state_key_file_others_can_read_is_refused_in_one_line(short_tmp: Path) -> None:
    """A 0644 key file: any local user (or a kernel running as another uid) could read the keys and seal request
    state every replica trusts."""
    tmp_path = Path(tempfile.mkdtemp(prefix="k", dir=short_tmp))
    key = tmp_path / "state.key"
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o644)
    proc = subprocess.run(kernelexec_cmd("serve", "--transport", "http", "--port", "0", "--state-dir", str(tmp_path / "state"),
                                         "--state-key-file", str(key)),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=clean_env(HOME=str(tmp_path)),
                          stdin=subprocess.DEVNULL)
    assert proc.returncode != 0, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().count("\n") == 0 and "0644" in proc.stderr and "--state-key-file" in proc.stderr, proc.stderr


def test_the_reach_counts_protected_names_and_only_venvs_that_were_there_first(tmp_path: Path, short_tmp: Path) -> None:
    require_bwrap()
    work = tmp_path / "w"
    (work / ".venv").mkdir(parents=True)
    (work / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    settings = make_settings(short_tmp, working_dir=work)
    reach = kernel_reach(settings)
    assert reach.writes(work / "x.py") and reach.writes(settings.sessions_dir / "abc" / "work" / "f")
    assert not reach.writes(work / ".git" / "config") and not reach.writes(work / ".claude" / "settings.json")
    assert not reach.writes(work / ".venv" / "pyvenv.cfg")  # there when first looked at
    (work / "venv").mkdir()
    (work / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert kernel_reach(settings).writes(work / "venv" / "pyvenv.cfg")  # appeared later: may be a kernel's
    assert not reach.writes(tmp_path / "elsewhere")


# --- every subprocess the server starts on the host ------------------------------------------------------
_AUDIT: list[tuple[str, list[str], str | None]] | None = None


def _audit_hook(event: str, args: tuple[Any, ...]) -> None:
    if _AUDIT is None or event != "subprocess.Popen":
        return
    executable, argv, cwd, _env = args
    _AUDIT.append((os.fsdecode(executable) if executable else "", [os.fsdecode(a) for a in argv], os.fsdecode(cwd) if cwd else None))


sys.addaudithook(_audit_hook)  # audit hooks cannot be removed: it records only while _AUDIT is a list


def _python_flags(argv: list[str]) -> list[str] | None:
    """The interpreter options of a Python command line, or None when it does not start Python."""
    for i, word in enumerate(argv):
        name = os.path.basename(word)
        if name.startswith("python") or word == sys.executable:
            flags = []
            for option in argv[i + 1:]:
                if not option.startswith("-") or option in ("-c", "-m"):
                    break
                flags.append(option)
            return flags
    return None


@pytest.mark.slow
async def test_every_host_process_the_server_starts_is_isolated_and_runs_nothing_a_kernel_could_write(
        short_tmp: Path, project: Path, tmp_path: Path) -> None:
    """The audit: serve's preflight, a session and its cells, doctor and replay, recorded by an audit hook
    in this (the server's) process. Each Python helper runs with -I from a directory no kernel reaches;
    no executable lies where kernels write; kernels are launched only through the sandbox shim."""
    global _AUDIT
    from kernelexec.doctor import preflight, report
    from kernelexec.session.replay import replay_notebook

    from .support import build_wheel, package_index

    require_bwrap()
    wheel = build_wheel(tmp_path / "wheels", "kxaudit", "1.0", "VALUE = 7\n")
    index_cm = package_index(tmp_path / "index", [wheel])
    index = index_cm.__enter__()
    settings = make_settings(short_tmp, working_dir=project, pool_size=1, restart_spares=1, index_url=index)
    reach = kernel_reach(settings)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 2\nx * 21")])
    nb_path = tmp_path / "a.ipynb"
    nbformat.write(nb, nb_path)
    _AUDIT = []
    try:
        probe.cache_clear()  # the sandbox probe runs again, under the audit
        preflight(settings)
        async with serving(settings) as h:
            a = await h.run("import os\nresult = 6 * 7")
            assert a["result"] == 42, a
            installed = await h.call("install_packages", packages=["kxaudit"])
            assert not installed.is_error, installed.content
            await h.call("restart_session")
        report(settings)
        await replay_notebook(nbformat.read(nb_path, as_version=4), settings, profile="standard")
        seen = list(_AUDIT)
    finally:
        _AUDIT = None
        index_cm.__exit__(None, None, None)
    assert seen, "the audit saw no process at all: the hook is not working"
    kernels = helpers = 0
    for executable, argv, cwd in seen:
        program = executable or argv[0]
        assert not reach.writes(shutil.which(program) or program), (program, argv)
        if argv[:2] == ["/bin/sh", "-c"] and any(a.endswith("sandbox_exec.py") for a in argv):
            kernels += 1
            wrapper = argv.index(next(a for a in argv if a.endswith("sandbox_exec.py")))
            assert "-I" in argv[:wrapper], argv  # the pre-exec wrapper runs before Landlock without bubblewrap
            assert argv[2].startswith("echo ") or argv[2].startswith("trap"), argv
            assert os.path.basename(argv[4]) == "bwrap", argv
            continue
        flags = _python_flags(argv)
        if flags is not None:
            helpers += 1
            assert "-I" in flags, argv
            assert cwd is not None and os.path.basename(cwd).startswith("kernelexec-helper-"), (argv, cwd)  # host.empty_directory
            assert not reach.reads(cwd), (argv, cwd)
            assert "--python" not in argv, argv
    pips = [argv for _, argv, _ in seen if "pip" in argv]
    assert kernels >= 2 and helpers >= 3 and len(pips) >= 2, seen  # the probe, the inspection, pip download + install


def test_a_protected_file_that_appeared_after_the_first_look_counts_as_writable(tmp_path: Path) -> None:
    """bubblewrap binds .mcp.json/.envrc/... read-only only where they exist: one made after the server first
    looked may be a kernel's, so the host treats it as kernel-written until a restart (as a new .venv)."""
    from kernelexec.host import KernelReach

    root = tmp_path / "root"
    root.mkdir()
    (root / ".envrc").write_text("export A=1\n")  # there at the first look: bound read-only for every kernel
    reach = KernelReach(write_roots=(str(root.resolve()),), read_roots=(), protected_bound=True)
    assert not reach.writes(root / ".envrc")
    (root / ".mcp.json").write_text("{}")  # appeared later: nothing tells who made it
    assert reach.writes(root / ".mcp.json")
    assert reach.writes(root / "anything.py")
