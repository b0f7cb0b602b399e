"""Nothing printed to a terminal is raw, tried as an attacker would.

The attacker writes the code a kernel runs, a notebook someone replays, or a setting someone is
persuaded to use; the target is the terminal of whoever runs ``kernelexec``: set its title, clear
it, hide text, overwrite a line, reorder text with a bidi override, or crash the print.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

import pytest

from kernelexec.terminal import SafeFormatter, safe, say

from .conftest import clean_env, kernelexec_cmd

HOSTILE = {
    "osc-title": "\x1b]0;pwned\x07",
    "osc-title-st": "\x1b]2;pwned\x1b\\",
    "clear-screen": "\x1b[2J\x1b[H",
    "hidden-text": "\x1b[8mrm -rf ~\x1b[0m",
    "carriage-return-overwrite": "evil command\rharmless    ",
    "backspace-overwrite": "evil\x08\x08\x08\x08good",
    "c1-csi": "\x9b2J",
    "c1-osc": "\x9d0;pwned\x9c",
    "bidi-override": "file\u202etxt.exe",
    "bidi-isolate": "a\u2066b\u2069c",
    "zero-width": "pass\u200bword",
    "arabic-letter-mark": "x\u061cy",
    "bom": "\ufeffhi",
    "lone-surrogate": "x\ud800y",
    "lone-low-surrogate": "x\udfffy",
    "del": "x\x7fy",
    "nul": "x\x00y",
    "bell": "ding\x07",
}


def dangerous(ch: str) -> bool:
    """What a terminal acts on or what hides/reorders text (independent of terminal.py's tables)."""
    code = ord(ch)
    if ch in "\n\t":
        return False
    return (code < 0x20 or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF
            or unicodedata.category(ch) == "Cf" and (0x200B <= code <= 0x200F or 0x202A <= code <= 0x202E
                                                       or 0x2066 <= code <= 0x2069 or code in (0xFEFF, 0x061C)))


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_safe_leaves_no_control_character(name: str) -> None:
    text = HOSTILE[name]
    out = safe(text)
    assert not any(dangerous(ch) for ch in out), (name, out)
    out.encode("utf-8")  # no lone surrogate left: the print cannot raise
    assert out != text  # something was escaped, visibly


def test_escapes_are_visible_and_name_the_character() -> None:
    assert safe("\x1b]0;pwned\x07") == "\\x1b]0;pwned\\x07"
    assert safe("\x1b[2J") == "\\x1b[2J"
    assert safe("\x1b[8mhidden") == "\\x1b[8mhidden"
    assert safe("ok\rno") == "ok\\rno"
    assert safe("\x9b31m") == "\\x9b31m"
    assert safe("abc\u202edef") == "abc\\u202edef"
    assert safe("x\ud800y") == "x\\ud800y"
    assert safe("\x7f") == "\\x7f"


def test_every_c0_c1_and_surrogate_code_point_is_escaped() -> None:
    for code in [*range(0x00, 0x20), *range(0x7F, 0xA0), 0xD800, 0xDBFF, 0xDC00, 0xDFFF,
                 *range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xFEFF, 0x061C]:
        ch = chr(code)
        out = safe(f"a{ch}b")
        if ch in "\n\t":
            assert out == f"a{ch}b"
            assert ch not in safe(f"a{ch}b", keep_newlines=False)
        else:
            assert ch not in out and out.startswith("a\\") and out.endswith("b"), hex(code)


def test_plain_text_and_ordinary_unicode_pass_unchanged() -> None:
    for text in ["", "hello world", "line 1\nline 2\n\tindented", "naïve café 中文 😀 ∑", "path\\with\\backslashes"]:
        assert safe(text) == text
    assert safe(42) == "42"
    assert safe("a\nb", keep_newlines=False) == "a\\nb"


def test_a_long_hostile_text_is_escaped_in_one_linear_pass() -> None:
    text = ("x" * 1000 + "\x1b[2J") * 1000  # 1 MB
    out = safe(text)
    assert "\x1b" not in out and out.count("\\x1b[2J") == 1000


def test_say_escapes_each_part(capsys: pytest.CaptureFixture[str]) -> None:
    say("cell:", "\x1b]0;pwned\x07", "\u202eevil")
    out = capsys.readouterr().out
    assert out == "cell: \\x1b]0;pwned\\x07 \\u202eevil\n"
    buf = io.StringIO()
    say("x\ud800", file=buf)
    assert buf.getvalue() == "x\\ud800\n"


def test_log_record_message_args_and_exception_text_are_escaped() -> None:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(SafeFormatter("kernelexec %(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("kernelexec.test_terminal")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("spare said %r / %s", "\x1b]0;pwned\x07", "\x1b[2J\u202e")
        try:
            raise RuntimeError("boom \x1b[8mhidden\x9b2J \ud800")
        except RuntimeError:
            log.exception("cell failed: %s", "\rX")
    finally:
        log.removeHandler(handler)
    text = buf.getvalue()
    assert "\x1b" not in text and "\x9b" not in text and "\u202e" not in text and "\r" not in text
    assert "\\x1b]0;pwned\\x07" in text and "\\x1b[8mhidden\\x9b2J \\ud800" in text
    assert "Traceback (most recent call last)" in text and "\n" in text  # the traceback keeps its lines
    text.encode("utf-8")


def state_dir(base: Path) -> str:
    return tempfile.mkdtemp(prefix="s", dir=base)  # short: kernel sockets live under it


def run_bytes(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(kernelexec_cmd(*args), capture_output=True, timeout=timeout, env=clean_env())


def assert_no_raw_controls(data: bytes) -> None:
    assert b"\x1b" not in data, data[:2000]
    text = data.decode("utf-8")  # also: valid UTF-8, no surrogate escapes
    for ch in text:
        assert not dangerous(ch), (hex(ord(ch)), text[:2000])


def test_the_real_logging_setup_escapes_log_lines(tmp_path: Path) -> None:
    """install_logging, as the CLI calls it, in a fresh interpreter: a hostile message and traceback."""
    script = (
        "import logging\n"
        "from kernelexec.terminal import install_logging\n"
        "install_logging()\n"
        "log = logging.getLogger('kernelexec.kernel.driver')\n"
        "log.warning('the warm spare is dead or lost its policy (%r)', '\\x1b]0;pwned\\x07\\x1b[2J')\n"
        "try:\n"
        "    raise ValueError('\\x1b[8mhidden\\x9b\\u202e\\ud800')\n"
        "except ValueError:\n"
        "    log.exception('restart failed')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, env=clean_env(PYTHONIOENCODING="utf-8"))
    assert done.returncode == 0, done.stderr
    assert b"pwned" in done.stderr and b"ValueError" in done.stderr
    assert_no_raw_controls(done.stderr)


ATTACK = r'''
import sys
print("\x1b]0;pwned\x07\x1b[2J\x1b[8mhidden\x1b[0m")
print("\x9b2J \u202eevil overwritten\rover")
sys.stderr.write("\x1b]2;stderr-title\x1b\\ \x9d0;c1\x9c\n")
print("pass\u200bword \u2066x\u2069 \ufeff \x7f")
raise RuntimeError("\x1b]0;pwned\x07 \x1b[2J \x9b31m \u202e")  # (lone surrogates: test_every_c0_c1_and_surrogate_code_point_is_escaped)
'''


def test_exec_of_hostile_code_prints_no_raw_control_bytes(short_tmp: Path) -> None:
    """A real ``kernelexec exec``: stdout, stderr, the exception's message and traceback all carry escapes."""
    done = run_bytes("exec", ATTACK, "--state-dir", state_dir(short_tmp))
    assert done.returncode == 1 and done.stdout, done.stderr  # the code raised
    answer = json.loads(done.stdout)
    assert "hidden" in answer["stdout"] and "RuntimeError" in answer["error"] and "pwned" in answer["error"]
    assert "\x1b" in answer["error"] and "\x1b" in answer["stderr"]  # the answer keeps them (JSON-escaped); the terminal gets none
    assert_no_raw_controls(done.stdout)
    assert_no_raw_controls(done.stderr)


def test_hostile_setting_is_escaped_in_exec_log_lines_and_doctor(short_tmp: Path) -> None:
    """A setting someone was persuaded to use (here a gateway URL) reaches a log line and doctor's report."""
    url = "http://127.0.0.1:1/\x1b]0;pwned\x07\x1b[2J\u202e"
    done = run_bytes("exec", "1", "--state-dir", state_dir(short_tmp), "--kernel-gateway", url)
    assert done.returncode == 1
    assert b"kernelexec WARNING" in done.stderr and b"pwned" in done.stderr  # the log line is there, escaped
    assert_no_raw_controls(done.stdout)
    assert_no_raw_controls(done.stderr)
    doctor = run_bytes("doctor", "--state-dir", state_dir(short_tmp), "--kernel-gateway", url, timeout=60)
    assert doctor.returncode == 0, doctor.stderr
    assert b"pwned" in doctor.stdout
    assert_no_raw_controls(doctor.stdout)
    assert_no_raw_controls(doctor.stderr)


def test_an_error_exit_message_is_escaped(short_tmp: Path) -> None:
    """A bad kernelspec name in the settings: the refusal quotes it, escaped."""
    done = run_bytes("exec", "1", "--state-dir", state_dir(short_tmp), "--kernel-spec", "nope\x1b]0;pwned\x07\x9b2J", timeout=60)
    assert done.returncode != 0
    assert b"pwned" in done.stderr
    assert_no_raw_controls(done.stdout)
    assert_no_raw_controls(done.stderr)


def test_an_uncaught_traceback_is_escaped(tmp_path: Path) -> None:
    script = ("import sys\n"
              "from kernelexec.terminal import install_excepthook\n"
              "install_excepthook()\n"
              "raise RuntimeError('\\x1b]0;pwned\\x07\\x9b2J\\ud800')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, env=clean_env(PYTHONIOENCODING="utf-8"))
    assert done.returncode == 1 and b"RuntimeError" in done.stderr and b"pwned" in done.stderr
    assert_no_raw_controls(done.stderr)
