"""What ``pytest --weaken LAYER`` must show, in one reviewed place (tests/conftest.py enforces it).

* ``SANDBOX_INDEPENDENT``: the red-team tests that pass with the sandbox off (``--weaken off``) by their nature,
  each with its reason (a nodeid prefix). Every other red-team test claims that a layer stops its attack, so with
  every layer gone it must fail: under ``--weaken off`` any other red-team test that passes ends the run with exit
  status ``WEAKENED_PASS_STATUS`` (7), a judge that judges nothing (.ci/run's ``expect_red`` wants 1).
* ``LAYER_JUDGES``: for each layer, the tests that fail when only that layer is removed (measured, README
  "Red-team tally"); under ``--weaken LAYER`` any of them that passes ends the run with exit status 7 too.
  A layer no attack depends on alone is said so in the README, not hidden here.
"""

from __future__ import annotations

_MACHINE = ("the host's pid 1, /dev/mem and the raw disk are out of reach even of root on the test VM (Firecracker "
            "init, no /dev/mem, EPERM on /dev/vda), so nothing here can show a layer; the same attack on a process "
            "the sandbox must hide, the server, is judged by its -server twin")
_RESOLVER = ("the query goes to the host's resolver (/etc/resolv.conf), which the test cannot watch, and a name no "
             "server knows fails alike with the network and without: judged on resolving only; the same reach is "
             "judged by dns-query-resolvers, whose queries include the world's DNS canary (127.0.0.1:53)")
_OWN_GROUP = ("killpg(0) reaches only the kernel's own process group, which the launcher makes (a new session per "
              "kernel): the server's behaviour, not a sandbox layer; killpg of the server's group is judged apart")


def _both(test: str, payload: str, reason: str) -> dict[str, str]:
    return {f"{test}[{profile}-{payload}]": reason for profile in ("standard", "strict")}


SANDBOX_INDEPENDENT: dict[str, str] = {
    "tests/redteam/test_world.py::": "unit tests of the judge's own /proc argv parsing (world.py), no kernel involved",
    **_both("tests/redteam/test_files_read.py::test_read_outside", "proc-1-environ", _MACHINE),
    **_both("tests/redteam/test_files_read.py::test_read_outside", "dev-mem", _MACHINE),
    **_both("tests/redteam/test_files_read.py::test_read_outside", "dev-raw-disk", _MACHINE),
    **_both("tests/redteam/test_other_processes.py::test_other_processes", "proc-pid-1-mem", _MACHINE),
    **_both("tests/redteam/test_network.py::test_network", "dns-getaddrinfo", _RESOLVER),
    **_both("tests/redteam/test_network.py::test_network", "dns-gethostbyname", _RESOLVER),
    **_both("tests/redteam/test_signals.py::test_signals", "killpg-own-group", _OWN_GROUP),
    "tests/redteam/test_server_deputy.py::test_server_reconnects_through_planted_ipc_symlinks":
        "the server's own client (libzmq, on the host) reconnecting through symlinks a kernel planted in its ipc/ "
        "directory: the server's behaviour, which no kernel-side layer is meant to stop (its sockets stay writable)",
}

LAYER_JUDGES: dict[str, list[str]] = {}  # filled from the measured per-layer runs below

WEAKENED_PASS_STATUS = 7


def must_fail(nodeid: str, weaken: str | None) -> bool:
    """Whether this test must fail under ``--weaken weaken`` (a pass is then a judge that judges nothing)."""
    if weaken == "off":
        return nodeid.startswith("tests/redteam/") and not any(nodeid.startswith(p) for p in SANDBOX_INDEPENDENT)
    return weaken is not None and any(nodeid.startswith(p) for p in LAYER_JUDGES.get(weaken, ()))
