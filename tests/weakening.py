"""What ``pytest --weaken LAYER`` must show, in one reviewed place (tests/conftest.py enforces it).

* ``SANDBOX_INDEPENDENT``: the red-team tests that pass with the sandbox off (``--weaken off``) by their nature,
  each with its reason (a nodeid prefix). Every other red-team test claims that a layer stops its attack, so with
  every layer gone it must fail: under ``--weaken off`` any other red-team test that passes ends the run with exit
  status ``WEAKENED_PASS_STATUS`` (7), a judge that judges nothing (.ci/run's ``expect_red`` wants 1).
* ``LAYER_JUDGES``: for each layer, the tests that fail when only that layer is removed (measured, docs/security.md
  "Red-team tally"); under ``--weaken LAYER`` any of them that passes ends the run with exit status 7 too.
  A layer no attack depends on alone is said so in docs/security.md, not hidden here.
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

_PROCESSES = "tests/redteam/test_processes.py::test_processes"
LAYER_JUDGES: dict[str, list[str]] = {  # measured on this machine kind; docs/security.md "Red-team tally" has the counts
    # fork and exec by routes the guard does not see (ctypes, clone3) or lets through to the OS (execve of Python)
    "seccomp": [*_both(_PROCESSES, "ctypes-libc-fork", ""), *_both(_PROCESSES, "ctypes-clone3", ""),
                *_both(_PROCESSES, "os.execve-python", ""), *_both(_PROCESSES, "subprocess.check_output-python", "")],
    # rewriting the kernel's own code through /proc/self/mem (bubblewrap mounts /proc; only Landlock refuses the write)
    "landlock": [*_both("tests/redteam/test_files_write.py::test_write_outside", "proc-self-mem-write", "")],
    # an O_PATH fd on a file outside (Landlock does not govern O_PATH opens; a mount namespace hides the path)
    "bubblewrap": [*_both("tests/redteam/test_files_read.py::test_read_outside", "fd-inventory", "")],
    # memfd pages written, never mapped: no rlimit counts them, the cgroup's memory cap alone stops them
    "cgroup": ["tests/redteam/test_limits.py::test_unmapped_shared_memory_stops_at_the_cgroup_memory_limit"],
    # (a presence check from /proc, not an attack: every attack it would stop, Landlock's ptrace scope and
    # bubblewrap's PID namespace stop too; see docs/security.md)
    "uid": ["tests/test_sandbox.py::test_as_root_each_kernel_runs_under_its_own_unprivileged_uid"],
    "guard": ["tests/test_policy.py::test_strict_refuses_all_file_access", "tests/test_policy.py::test_guard_survives_rebinding_builtins",
              "tests/test_policy.py::test_standard_refuses_processes_by_any_route",
              "tests/test_policy.py::test_strict_refuses_other_imports_with_a_message_naming_them"],
    # netns: none. Every network payload is stopped with it removed (seccomp's socket families, Landlock's TCP
    # rules and abstract-unix scope): defence in depth, said in docs/security.md
}

WEAKENED_PASS_STATUS = 7


def must_fail(nodeid: str, weaken: str | None) -> bool:
    """Whether this test must fail under ``--weaken weaken`` (a pass is then a judge that judges nothing)."""
    if weaken == "off":
        return nodeid.startswith("tests/redteam/") and not any(nodeid.startswith(p) for p in SANDBOX_INDEPENDENT)
    return weaken is not None and any(nodeid.startswith(p) for p in LAYER_JUDGES.get(weaken, ()))
