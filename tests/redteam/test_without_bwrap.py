"""The same attacks on a machine without bubblewrap and without a network namespace (a non-root
server where user namespaces are disabled, e.g. Ubuntu 24.04's AppArmor userns restriction). Landlock
is there, so the server starts strict/standard without --allow-degraded. os mode only: the guard (which
refuses every socket but AF_UNIX creation) is switched off, as before. Judged as everywhere else,
plus session B's variable unchanged.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from .. import support
from ..support import make_settings, start_harness
from .common import Target, assert_untouched, attack, open_sessions
from .test_files_read import FILE_READS
from .test_files_write import FILE_WRITES
from .test_network import NETWORK
from .test_other_processes import OTHER_PROCESSES
from .test_other_sessions import CROSS_SESSION
from .test_processes import SUBPROCESS
from .test_signals import SIGNALS
from .world import World

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def no_bwrap(world: World, short_tmp: Path) -> AsyncIterator[Target]:
    import dataclasses

    import kernelexec.sandbox.probe as probe_mod
    import kernelexec.session.session as sessions_mod

    settings = make_settings(short_tmp, profile="standard", read_dirs=[world.ro_dir])
    real_plan_for = sessions_mod.plan_for

    def plan_for(s: Any, profile: Any, **kwargs: Any) -> Any:
        if s.state_dir != settings.state_dir:
            return real_plan_for(s, profile, **kwargs)
        real_probe = probe_mod.probe
        features = dataclasses.replace(real_probe(), bwrap=None, netns=False)
        probe_mod.probe = lambda: features  # only while planning this server's kernels (synchronous)
        try:
            return real_plan_for(s, profile, **kwargs)
        finally:
            probe_mod.probe = real_probe

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sessions_mod, "plan_for", plan_for)
        h, cm = await start_harness(settings)
        t = Target(profile="standard", h=h, cm=cm, state_dir=settings.state_dir)
        try:
            await open_sessions(t, roles=("os", "b"))
            r = await h.run("1", session=t.handles["os"])
            assert "bubblewrap" not in r["layers"] and "netns" not in r["layers"], r["layers"]
            if not support.WEAKEN:  # (weakened, the judges below must go red, not this precondition)
                assert any(layer.startswith("landlock") for layer in r["layers"]) and "seccomp" in r["layers"], r["layers"]
            yield t
        finally:
            await h.client.__aexit__(None, None, None)
            await cm.__aexit__(None, None, None)


NO_BWRAP: dict[str, str] = {
    "read-secret": FILE_READS["open"],
    "write-outside": FILE_WRITES["open-w"],
    "modify-readonly": FILE_WRITES["open-a-readonly-canary"],
    "proc-server-environ": FILE_READS["proc-server-environ"],
    "tcp-connect": NETWORK["tcp-connect"],
    # Landlock's CONNECT_TCP hook is on connect(); sendto(MSG_FASTOPEN) connects without it (kernel 6.18)
    "tcp-fastopen-sendto": NETWORK["tcp-fastopen-sendto"],
    "udp-sendto": NETWORK["udp-sendto"],
    "abstract-unix": NETWORK["abstract-unix"],
    # Landlock ABI 7 has no right for connect() on pathname unix sockets: a mount namespace hid them
    "pathname-unix-host-socket": NETWORK["pathname-unix-host-socket"],
    "raw-unix-connect-b-sockets": CROSS_SESSION["raw-unix-connect-b-sockets"],
    "zmq-hb-echo-b": CROSS_SESSION["zmq-hb-echo"],
    "zmq-shell-execute-in-b": CROSS_SESSION["zmq-shell-execute-in-b"],
    "open-b-file": CROSS_SESSION["open-b-file"],
    "kill-server": SIGNALS["kill-SIGUSR1"],
    "kill-server-0": SIGNALS["kill-0-probe"],
    "os.fork": SUBPROCESS["os.fork"],
    "process_vm_readv-server": OTHER_PROCESSES["process_vm_readv-server-memory"],
}


@pytest.mark.parametrize("name", list(NO_BWRAP))
async def test_without_bubblewrap_or_netns(world: World, no_bwrap: Target, name: str) -> None:
    t = no_bwrap
    tag = f"nobwrap-{name}-{secrets.token_hex(3)}"
    a = await attack(world, t, "os", NO_BWRAP[name], tag, category="no-bwrap", name=name,
                     extra={"_main": True} if NO_BWRAP[name].lstrip().startswith("# main interpreter") else None)
    await assert_untouched(world, t, a)
    r = await t.h.run("bsecret", session=t.handles["b"])
    assert r["result"] == t.b_var_secret, f"{a.result}: session B's variable changed: {r}"
