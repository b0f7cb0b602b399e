"""A fleet: several ``kernelexec serve`` replicas on one session store are one service (docs/fleet.md).

- **Admission** (``Fleet.join``): every server on a shared store (PostgreSQL, or any store with gateway kernels)
  registers as a lease ``replica:<kind>:<id>``, renewed while it runs. Replicas whose kernels live on a gateway
  (``--kernel-gateway``: every replica can reach them) join each other; a server with local kernels joins only a
  store no other server serves, and nothing joins a store such a server serves. Anything else is refused at
  start with one line saying what to use instead (``FleetRefused``).
- **Driving a session** (``Fleet.attach`` / ``Fleet.detach``, through ``Session.driving``): with gateway kernels a
  session's calls run under its lease (expiry ``LEASE_TTL``, renewed every ``RENEW_EVERY`` while held). Taking it,
  the replica, when another replica drove the session since (the token is not its last one plus one), drops its
  connection to the kernel and brings its copy of the record up to the store's journal, then attaches to the
  session's gateway kernel (its id is in the store); letting go, it records the kernel's id and releases the lease,
  its connection kept for its next call (used only after the lease is taken again; closed once another replica
  drives the session). Every journal write carries the lease's fencing token: a replica that lost its lease
  (paused, cut off) cannot write, and lets go.
- **Runs a stopped replica left** (``Fleet.adopt_orphans``): taking a session, a replica adopts the runs a
  replica that stopped mid-cell (SIGKILLed, or drained and handed over) left on its kernel, and collects their
  answers from the gateway (``Session.collect_orphans``); those it cannot collect are recorded lost.
- **Once per fleet** (``Fleet.leads``): a leader lease ``fleet:upkeep`` for the work that must not run once per
  replica (reaping idle sessions' kernels on the gateway).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from kernelexec.errors import KernelexecError, SessionError
from kernelexec.store import Fence, Lease, RunRecord, StaleLease, Store, StoreError
from kernelexec.store.interface import UNFINISHED

if TYPE_CHECKING:
    from kernelexec.session.session import Session

logger = logging.getLogger(__name__)

LEASE_TTL = 5.0  # seconds a lease outlives its holder's last renewal: the longest a failover waits
RENEW_EVERY = 1.0  # seconds between renewals (a paused replica misses several before its lease runs out)
WAIT_EVERY = 0.05  # seconds between tries for a lease another replica holds
REPLICAS = "replica:"
UPKEEP = "fleet:upkeep"


class FleetRefused(KernelexecError):
    """This server may not join the store: other servers serve it and not every kernel is reachable by all."""


def admission(kind: str, others: list[Lease], store: str) -> str | None:
    """Why a server of ``kind`` ("gateway" or "local") may not serve ``store`` beside ``others`` (live replica
    leases), or None. One line each: what to use instead."""
    if not others:
        return None
    names = ", ".join(sorted({replica_name(lease.session) for lease in others}))
    local = [lease for lease in others if lease.session.startswith(f"{REPLICAS}local:")]
    if kind == "local":
        return (f"refusing to start: the store {store} is served by other kernelexec servers ({names}), and this one's "
                "kernels are local, so no other replica could reach them; start every replica with --kernel-gateway URL "
                "(and one --state-key-file), or give this server a store of its own")
    if local:
        return (f"refusing to start: the store {store} is served by a kernelexec server with local kernels "
                f"({', '.join(sorted(replica_name(lease.session) for lease in local))}), which this replica cannot reach; "
                "restart that server with --kernel-gateway URL, or give this one a store of its own")
    return None


def replica_name(replica: str) -> str:
    """A replica's name in a message: host, pid and random part, from its id or its key (``replica:<kind>:<id>``),
    without the ``@`` proof of identity (``gone_here``)."""
    name = replica.split(":", 2)[-1]
    return name.rpartition("@")[0] or name


def replica_id() -> str:
    """This process's name in the fleet: host, pid and a random part (a restarted replica is a new one), then
    ``@`` and what tells this process apart on its machine (``_incarnation``), when the machine says."""
    name = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    here = _incarnation()
    return f"{name}@{here}" if here else name


def _incarnation() -> str | None:
    """``<boot id>.<pid namespace>.<time namespace>.<pid>.<start time>`` of this process: the running kernel's boot,
    the namespaces its pid and its start time are read in, and its start in clock ticks after boot (a reused pid has
    another); None where /proc is not this process's own (another pid namespace's) or does not say."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None  # /proc of another pid namespace: its pids are not ours
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip().replace("-", "")
        pid_ns = os.stat("/proc/self/ns/pid").st_ino
        time_ns = os.stat("/proc/self/ns/time").st_ino if os.path.exists("/proc/self/ns/time") else 0  # Linux < 5.6: none
        state, start = _state_and_start("self")
    except (OSError, ValueError):
        return None
    if not (boot.isascii() and boot.isalnum()) or start is None:
        return None
    return f"{boot}.{pid_ns}.{time_ns}.{os.getpid()}.{start}"


def _state_and_start(pid: str) -> tuple[str, int | None]:
    """A process's state letter and start time (clock ticks after boot), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces and parentheses
    if len(fields) <= 19 or not fields[19].isdecimal():
        return (fields[0] if fields else ""), None
    return fields[0], int(fields[19])  # fields 3 and 22 of proc(5)


def gone_here(replica: str) -> bool:
    """Whether ``replica`` (another registration's holder) was a process of this host, its running kernel's boot
    and this pid and time namespace, that no longer runs (no such pid, a zombie, or the pid reused by a process
    started at another time). Then a server restarted at once after a SIGKILL starts without waiting for its
    predecessor's registration to run out (up to ``LEASE_TTL``). Anything not proven gone counts as live: another
    host, container or boot, an older kernelexec's id (no proof), a malformed one."""
    try:
        return _proven_gone(replica)
    except Exception:  # noqa: BLE001 - a registration another process wrote never stops this server's start
        return False


def _proven_gone(replica: str) -> bool:
    name, at, proof = replica.rpartition("@")
    parts = proof.split(".")
    here = _incarnation()
    if not at or here is None or len(parts) != 5 or not all(p.isascii() and p.isalnum() for p in parts):
        return False
    if name.rsplit("-", 2)[0] != socket.gethostname() or parts[:3] != here.split(".")[:3]:
        return False  # another host (a clone of this machine keeps its boot id), boot, container or time namespace
    if not (parts[3].isdecimal() and parts[4].isdecimal()) or not 0 < int(parts[3]) < 1 << 22:
        return False
    pid, start = int(parts[3]), int(parts[4])
    try:
        os.kill(pid, 0)  # answers for every process of this namespace, even where /proc hides other users'
    except ProcessLookupError:
        return True
    except OSError:
        return False  # it exists (another user's): live
    state, now = _state_and_start(str(pid))
    return state == "Z" or (now is not None and now != start)


class Fleet:
    """This server's place in the store's fleet: its registration, the session leases it holds, the leader lease."""

    def __init__(self, store: Store, *, remote: bool) -> None:
        self.store = store
        self.id = replica_id()
        self.kind = "gateway" if remote else "local"
        self.drives = remote  # sessions are driven under leases (their kernels are reachable from every replica)
        self.held: dict[str, Lease] = {}  # sessions this replica drives now
        self.taken: dict[str, Lease] = {}  # the last lease taken per session: its writes' fence, even once lost
        self.lost: set[str] = set()  # sessions whose lease ran out while held (renewal refused)
        self._me: Lease | None = None
        self._leader: Lease | None = None
        # sessions whose kernel this replica keeps a connection to between its driving periods, and how to drop one
        # (set by the manager): dropped once another replica drives it (``drop_superseded``)
        self.connected: Callable[[], list[str]] = list
        self.drop: Callable[[str], None] = lambda handle: None

    @property
    def key(self) -> str:
        return f"{REPLICAS}{self.kind}:{self.id}"

    async def join(self) -> None:
        """Register, then look: two servers starting together both see each other (and a conflict refuses both).
        A registration whose process is proven gone from this machine does not count (``gone_here``: a server
        restarted at once after a SIGKILL finds its own previous process there); any other conflict is looked at
        again until a dead server's registration has run out, so only a live one refuses."""
        self._me = await self.store.acquire_lease(self.key, self.id, LEASE_TTL)
        with anyio.move_on_after(LEASE_TTL + RENEW_EVERY):
            while True:
                others = [lease for lease in await self.store.live_leases(REPLICAS)
                          if lease.holder != self.id and not (lease.holder and gone_here(lease.holder))]
                refusal = admission(self.kind, others, self.store.url)
                if refusal is None:
                    break
                await anyio.sleep(0.25)
                self._me = await self.store.renew_lease(self._me, LEASE_TTL) if self._me is not None else None
        if refusal is not None:
            await self.leave()
            raise FleetRefused(refusal)
        if others:
            logger.info("joined a fleet of %d other replica(s) as %s", len(others), self.id)

    async def leave(self) -> None:
        """Release everything (a clean stop: the next replica need not wait for expiry)."""
        for lease in [*self.held.values(), *(x for x in (self._leader, self._me) if x is not None)]:
            try:
                await self.store.release_lease(lease)
            except StoreError:
                logger.warning("releasing lease %s failed", lease.session)
        self.held.clear()
        self._me = self._leader = None

    async def keep(self) -> None:
        """The renewals, every ``RENEW_EVERY`` seconds while the server runs (in the manager's task group)."""
        while True:
            await anyio.sleep(RENEW_EVERY)
            try:
                await self.renew()
                await self.drop_superseded()
            except StoreError as exc:  # the store is unreachable for a moment: leases run out if it stays so
                logger.warning("renewing this replica's leases: %s", exc)

    async def drop_superseded(self) -> None:
        """Close this replica's kept connection to each kernel another replica drives now (one store read for all).
        The gateway keeps a kernel's messages for a connection that closes only when it was the kernel's last one:
        so that the driving replica's is the last, and its running cell's answer survives it (``adopt_orphans``)."""
        kept = [handle for handle in self.connected() if handle not in self.held]
        if not kept:
            return
        driven = {lease.session for lease in await self.store.live_leases("") if lease.holder != self.id}
        for handle in kept:
            if handle in driven and handle not in self.held:
                self.drop(handle)

    async def renew(self) -> None:
        store = self.store
        self._me = (await store.renew_lease(self._me, LEASE_TTL) if self._me is not None else None) or \
            await store.acquire_lease(self.key, self.id, LEASE_TTL)
        for handle, lease in list(self.held.items()):
            renewed = await store.renew_lease(lease, LEASE_TTL)
            if renewed is None:
                if self.held.get(handle) is lease:
                    del self.held[handle]
                    self.lost.add(handle)
                    logger.warning("session %s: this replica's lease ran out and was taken (token %d is stale): "
                                   "its writes are refused; letting go", handle, lease.token)
            elif self.held.get(handle) is lease:
                self.held[handle] = renewed
        if self.drives:
            leader = await store.renew_lease(self._leader, LEASE_TTL) if self._leader is not None else None
            self._leader = leader or await store.acquire_lease(UPKEEP, self.id, LEASE_TTL)

    @property
    def leads(self) -> bool:
        """Whether this replica runs the fleet's once-per-fleet work now."""
        return self._leader is not None

    def fence(self, handle: str) -> Fence | None:
        """What a write about ``handle`` carries: the token of the lease this replica last took for it."""
        lease = self.taken.get(handle)
        return Fence.of(lease) if lease is not None else None

    async def check(self, handle: str) -> None:
        """Right before a destructive kernel request (restart, shutdown, interrupt): one store round trip with the
        lease's token; StaleLease unless this replica still holds the session. A replica paused past its lease
        (SIGSTOP, a long GC) that wakes never sends one to a kernel another replica drives now."""
        lease = self.held.get(handle)
        renewed = await self.store.renew_lease(lease, LEASE_TTL) if lease is not None else None
        if renewed is None:
            if lease is not None and self.held.get(handle) is lease:
                del self.held[handle]
                self.lost.add(handle)
            raise StaleLease(f"session {handle}: this replica no longer holds the session's lease, so its kernel "
                             "request was not sent")
        if self.held.get(handle) is lease:
            self.held[handle] = renewed

    async def hold(self, handle: str, *, wait: bool = True) -> tuple[Lease, bool] | None:
        """The session's lease, waiting while another live replica drives it (at most ``LEASE_TTL`` after that one
        died; None at once without ``wait``); and whether nobody else held it since this replica last did (then its
        connection to the kernel and its copy of the record are current)."""
        while True:
            lease = await self.store.acquire_lease(handle, self.id, LEASE_TTL)
            if lease is not None:
                break
            if not wait:
                return None
            await anyio.sleep(WAIT_EVERY)
        before = self.taken.get(handle)
        self.held[handle] = self.taken[handle] = lease
        self.lost.discard(handle)
        current = lease.token == 1 if before is None else lease.token == before.token + 1  # 1: nobody held it before
        return lease, current

    async def attach(self, session: Session, *, wait: bool = True) -> bool:
        """Take ``session``'s lease (its lock held): its runs a dead holder left marked lost, its record made the
        store's, and the gateway kernel to attach to named (``Session.ensure_kernel`` attaches). False when another
        replica holds it and ``wait`` is off."""
        handle = session.handle
        held = await self.hold(handle, wait=wait)
        if held is None:
            return False
        lease, current = held
        try:
            if lease.taken_from is not None:
                logger.warning("session %s taken over from replica %s (its lease ran out)", handle,
                               replica_name(lease.taken_from))
                session.notice = (f"before this call: the replica that drove this session ({replica_name(lease.taken_from)}) stopped "
                                  "answering, and this one took the session over; the kernel kept running on the gateway")
            if not current:  # another replica drove it since: this one's connection and copy of the record are stale
                session.forget_kernel()
                entries = await self.store.journal(handle)
                await anyio.to_thread.run_sync(session.recorder.write_journal, [e.record for e in entries])
            record = await self.store.get_session(handle, owner=session.owner)
            if record is None or record.closed is not None:  # closed on another replica
                session.closed = True
                raise SessionError.unknown(handle)
            session.attach_to = record.gateway_kernel_id
            if not current:
                await self.adopt_orphans(session, lease, record.gateway_kernel_id)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.lose_uncollected(session)
                await self.let_go(handle)
            raise
        return True

    async def adopt_orphans(self, session: Session, lease: Lease, kernel_id: str | None) -> None:
        """The session's runs still unfinished under a replica that stopped (its lease ran out, or it drained and
        handed them over): those it could leave for collection on the same gateway kernel (``RunRecord.resume``)
        become this replica's, collected once the kernel is attached (``Session.collect_orphans``); the others are
        recorded lost. Fenced by the session's lease: only its holder adopts, once."""
        fence = Fence.of(lease)
        for run in await self.store.runs_of(session.handle, owner=session.owner):
            if run.state not in UNFINISHED or run.holder == self.key:
                continue
            if run.holder is not None and lease.taken_from is None and await self.store.current_lease(run.holder) is not None:
                continue  # its replica lives (paused past its lease, it finds its writes refused)
            resume = run.resume or {}
            # a run waiting in input() is not: its question went to the replica that stopped, and nobody can answer it
            if (run.state == "running" and kernel_id is not None and resume.get("kernel") == kernel_id
                    and resume.get("channel") and resume.get("msg_id")):
                await self.store.put_run(RunRecord(run.id, run.session, run.owner, "running", holder=self.key), fence=fence)
                session.reclaiming.append(run)
                logger.warning("session %s: run %s of replica %s is collected here", session.handle, run.id,
                               replica_name(run.holder or ""))
            elif await self.store.lose_run(run.id, fence=fence):
                logger.warning("session %s: run %s of replica %s recorded as lost", session.handle, run.id,
                               replica_name(run.holder or ""))

    async def detach(self, session: Session) -> bool:
        """After a driving period: the kernel's id recorded (fenced), the kernel detached (it stays on the gateway),
        the lease released. False when the lease was lost meanwhile (nothing was written)."""
        handle = session.handle
        kernel = session.kernel
        kernel_id = getattr(kernel, "kernel_id", None)
        kept = handle not in self.lost
        try:
            if kept and kernel_id != session.attach_to and session.remember is not None:
                await session.remember(session, kernel_id, self.fence(handle))
                session.attach_to = kernel_id
        except StoreError as exc:
            kept = False
            logger.warning("session %s: recording its kernel: %s", handle, exc)
        finally:
            if not kept:
                session.forget_kernel()
            await self.lose_uncollected(session)
            await self.let_go(handle)  # the kernel stays attached: if nobody else takes the lease, the next call reuses it
        return kept

    async def lose_uncollected(self, session: Session) -> None:
        """Runs adopted in this driving period (``adopt_orphans``) whose kernel was never attached to collect them (the
        call cancelled while attaching, the session limits refusing a kernel, an error on the way): recorded lost under
        the lease still held. Left named as this live replica's, no other replica would adopt them, and every get_run
        would say they run on."""
        runs, session.reclaiming = session.reclaiming, []
        fence = self.fence(session.handle)
        for run in runs:
            try:
                if fence is not None and await self.store.lose_run(run.id, fence=fence):
                    logger.warning("session %s: run %s recorded as lost: its kernel was not attached to collect it",
                                   session.handle, run.id)
            except KernelexecError as exc:  # the lease lost meanwhile, or the store away: its next holder looks again
                logger.warning("session %s: recording run %s as lost: %s", session.handle, run.id, exc)

    async def let_go(self, handle: str) -> None:
        lease = self.held.pop(handle, None)
        if lease is not None:
            try:
                await self.store.release_lease(lease)
            except StoreError as exc:  # it runs out by itself
                logger.warning("releasing the lease of %s: %s", handle, exc)
