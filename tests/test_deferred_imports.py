"""kernelexec's processes do not pay for jsonschema's IRI grammar at start, and its iri checks still answer."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("rfc3987_syntax") is None,
                                reason="rfc3987-syntax is not installed (it comes with jsonschema[format-nongpl])")

PROBE = """
import json, sys, time
t0 = time.process_time()
import kernelexec.server.build, nbformat, jsonschema
startup_cpu = time.process_time() - t0
built_at_start = "rfc3987_syntax.syntax_helpers" in sys.modules
checker = jsonschema.FormatChecker()
answers = [checker.conforms(v, f) for v, f in (("https://example.org/ä?q=1#f", "iri"), ("not an iri", "iri"),
                                               ("../relative/path", "iri-reference"), ("a b", "iri-reference"))]
print(json.dumps({"built_at_start": built_at_start, "answers": answers, "startup_cpu": startup_cpu,
                  "real_after_use": type(sys.modules["rfc3987_syntax"]).__module__ == "builtins"
                                    and "rfc3987_syntax.syntax_helpers" in sys.modules}))
"""


def _probe(*prelude: str) -> dict:
    done = subprocess.run([sys.executable, "-I", "-c", "\n".join(prelude) + PROBE], capture_output=True, text=True,
                          timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_server_process_starts_without_the_iri_grammar_and_its_iri_checks_answer_as_the_real_ones_do() -> None:
    deferred = _probe()
    # what jsonschema answers without kernelexec in the process (the real module imported at once)
    real = _probe("import jsonschema")
    assert real["built_at_start"] and not deferred["built_at_start"]
    assert deferred["answers"] == real["answers"] == [True, False, True, False]
    assert deferred["real_after_use"]


def test_a_broken_real_module_fails_the_check_that_uses_it_and_the_next_use_tries_again() -> None:
    """The stand-in never swallows the real import's failure into a silent "valid"."""
    code = """
import importlib, importlib.util, sys, kernelexec, jsonschema
fail = [True]
original = importlib.import_module
def import_module(name, package=None):
    if name == "rfc3987_syntax" and fail[0]:
        fail[0] = False
        raise ImportError("simulated: the real module cannot load")
    return original(name, package)
importlib.import_module = import_module
stand_in = sys.modules["rfc3987_syntax"]
assert importlib.util.find_spec("rfc3987_syntax").origin.endswith("rfc3987_syntax/__init__.py")
try:
    stand_in.is_valid_syntax("iri", "https://example.org")
    print("no error")
except ImportError as exc:
    print("first:", exc)
print("second:", stand_in.is_valid_syntax("iri", "https://example.org"), stand_in.is_valid_syntax("iri", "no iri"))
"""
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["first: simulated: the real module cannot load", "second: True False"]


def test_its_submodules_and_other_names_import_as_before() -> None:
    code = """
import sys, kernelexec, jsonschema
import rfc3987_syntax.syntax_helpers as helpers
from rfc3987_syntax import is_valid_syntax_iri
names = {}
exec("from rfc3987_syntax import *", names)
assert "is_valid_syntax" in names and "is_valid_syntax_ipath" in names, sorted(names)
print(helpers.is_valid_syntax_iri("https://example.org"), is_valid_syntax_iri("no iri"),
      sys.modules["rfc3987_syntax"].is_valid_syntax("iri", "https://example.org"),
      type(sys.modules["rfc3987_syntax"]).__name__)
"""
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False", "True", "module"]
