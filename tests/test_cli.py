"""The kernelexec command line: exec prints execute_code's JSON; --help shows defaults; config shows settings."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .conftest import clean_env, kernelexec_cmd


def run(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(kernelexec_cmd(*args), input=stdin, capture_output=True, text=True, timeout=120, env=env or clean_env())


def test_exec_prints_the_structured_answer(short_tmp: Path) -> None:
    proc = run("exec", "--state-dir", str(short_tmp / "cli"), "result = 6 * 7\nprint('hi')")
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["result"] == 42 and answer["stdout"] == "hi\n" and answer["success"] is True


def test_exec_reads_stdin_and_exits_nonzero_on_error(short_tmp: Path) -> None:
    proc = run("exec", "--state-dir", str(short_tmp / "cli"), "-", stdin="1/0")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["error"] == "ZeroDivisionError: division by zero"


def test_help_shows_defaults_for_every_command() -> None:
    for command in ("serve", "exec", "config"):
        proc = run(command, "--help")
        assert proc.returncode == 0
        assert "(default: standard)" in proc.stdout and "--default-timeout" in proc.stdout


def test_config_precedence_flag_over_env_over_toml(tmp_path: Path) -> None:
    toml = tmp_path / "k.toml"
    toml.write_text('profile = "strict"\ndefault_timeout = 5\nmax_sessions = 3\n')
    env = clean_env(KERNELEXEC_DEFAULT_TIMEOUT="7")
    proc = run("config", "--config", str(toml), "--max-sessions", "4", env=env)
    assert proc.returncode == 0, proc.stderr
    config = json.loads(proc.stdout)
    assert (config["profile"], config["default_timeout"], config["max_sessions"]) == ("strict", 7.0, 4)


def test_a_missing_config_file_is_refused_not_read_as_empty(tmp_path: Path) -> None:
    """pydantic-settings reads a TOML file that is not there as empty: a typo in --config ran on the defaults."""
    missing = tmp_path / "nope.toml"
    for proc in (run("config", "--config", str(missing)), run("config", env=clean_env(KERNELEXEC_CONFIG=str(missing)))):
        assert proc.returncode != 0 and not proc.stdout, proc.stdout
        assert str(missing) in proc.stderr and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_setting_is_a_clear_message_not_a_traceback() -> None:
    proc = run("config", "--profile", "nonsense")
    assert proc.returncode != 0 and "invalid choice" in proc.stderr
    proc = run("config", "--default-timeout", "-3")
    assert proc.returncode != 0 and "default_timeout" in proc.stderr and "Traceback" not in proc.stderr


def test_serve_on_a_port_in_use_says_so_in_one_line(short_tmp: Path) -> None:
    """A second `kernelexec serve --transport http` on the same port: uvicorn's SystemExit(3) came out of the task
    groups as a 70-line traceback after a line announcing the URL."""
    import socket

    from .support import free_port

    port = free_port()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = subprocess.run(kernelexec_cmd("serve", "--transport", "http", "--port", str(port), "--state-dir",
                                             str(short_tmp / "inuse")), env=clean_env(), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--port" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "/mcp" not in done.stderr, done.stderr


def test_serve_refuses_a_state_dir_too_long_for_socket_paths_with_what_to_do(tmp_path: Path) -> None:
    """A long HOME (its default ~/.local/state/kernelexec) used to kill the server at its first session."""
    import subprocess

    from .conftest import clean_env, kernelexec_cmd

    long_dir = tmp_path / ("d" * 100)
    done = subprocess.run(kernelexec_cmd("serve", "--state-dir", str(long_dir)), env=clean_env(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "too long for the kernels' unix socket paths" in done.stderr and "--state-dir" in done.stderr


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path: Path) -> None:
    """`kernelexec config | head -1`: the pipe closes under the printing command, which ended in a BrokenPipeError
    traceback; now it exits quietly (1, as Python's own advice has it)."""
    proc = subprocess.Popen(kernelexec_cmd("config", "--state-dir", str(tmp_path)), env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 1 and "Traceback" not in err and "BrokenPipe" not in err, err
