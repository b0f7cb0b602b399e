"""Checkpoints of the user namespace, inside the kernel. Stdlib only, never imports kernelexec.

After a cell, the names it may have changed (rebound: a new ``id``; or read by the cell, so perhaps
mutated in place) are pickled by a background thread into the session's ``checkpoint/`` directory,
each into its own file (temp + rename), then ``manifest.json`` (temp + rename): a kill mid-write leaves
the last good manifest and every file it names. Neither the answer nor the next cell ever waits for a
save: a cell's start drops the save in progress, which is done again after it (``Checkpointer``).
A fork gets the checkpoint through this kernel too (``export``, then ``serve_relay``'s comm reads pieces out;
the fork's kernel's comm ``receive``s them): the server relays the pieces, unread, as binary buffers.

A checkpoint is data this kernel wrote: it is loaded only here, in a kernel of the same session (or
its fork), by ``restore``, outside the guard's bypass, so loading it can do no more than a cell could.
The server never unpickles or reads it.

Not saved, and named in the manifest: what pickle refuses (open files, sockets, generators, locks),
functions and classes defined in cells (stdlib pickle stores them by name), and what the size cap
(``checkpoint_cap`` bytes) left out. Modules are kept as their names and imported again.

Each saved value also records the source files of the modules its classes and functions come from (path,
size, mtime): when one of them has changed by the time of a restore, the value is refused (reported as
failed, so the server recomputes it from its cell or names it lost) rather than loaded as an object of
the old class shape under the new class.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import stat
import sys
import threading
import types
from itertools import filterfalse
from typing import Any

MANIFEST = "manifest.json"
COMM_TARGET = "kernelexec.checkpoint"  # a fork's relay: the server's comm messages, the bytes as binary buffers
_SKIP_TYPES = (types.ModuleType,)
_GONE = object()


class _Pickler(pickle.Pickler):
    """The C pickler, noting the module of every class, function and instance it meets (the hook is not
    called for exact ints, floats, strs, bytes, lists, dicts, tuples, sets: a big list of numbers costs
    nothing more)."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        kind = obj if isinstance(obj, type) else type(obj)
        self.modules.add(getattr(kind, "__module__", None) or "")
        if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
            self.modules.add(getattr(obj, "__module__", None) or "")
        return NotImplemented


def _stamp(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return [st.st_size, st.st_mtime_ns]


def _sources(modules: set[str]) -> dict[str, list[Any]]:
    """{module: [its file, size, mtime_ns]} for the modules loaded from a file."""
    out: dict[str, list[Any]] = {}
    for name in sorted(modules):
        if not name or name in ("__main__", "builtins") or name in sys.builtin_module_names:
            continue
        path = getattr(sys.modules.get(name), "__file__", None)
        stamp = _stamp(path) if isinstance(path, str) else None
        if isinstance(path, str) and stamp is not None:
            out[name] = [path, *stamp]
    return out


def _changed(sources: Any) -> str | None:
    """The first module whose file is not what it was at the save (a forged entry is just refused)."""
    if sources is None:
        return None
    if not isinstance(sources, dict):
        return "?"
    for name, seen in sources.items():
        if not (isinstance(seen, list) and len(seen) == 3 and isinstance(seen[0], str)):
            return str(name)[:80]
        if _stamp(seen[0]) != seen[1:]:
            return str(name)[:80]
    return None


def _root(node: ast.AST) -> str | None:
    """``df`` of ``df``, ``df.a.b``, ``df['x'][0]``."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _names(cell: str) -> tuple[set[str], set[str]] | None:
    """(names the cell may bind, names it may have changed in place); None when it does not parse. In place:
    the root of an assigned or deleted attribute or item (``df['x'] = …``, ``del d[k]``, ``a.b += 1``), of a
    method called (``lst.append(…)``, ``df.drop(…, inplace=True)``), or a name passed to a call (``f(lst)``).
    A name only read (``float(df['e'].iloc[-1])``) is not saved again."""
    try:
        tree = ast.parse(cell)
    except (SyntaxError, ValueError):
        return None
    wrote: set[str] = set()
    changed: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                wrote.add(node.id)
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            root = _root(node)
            if root is not None:
                changed.add(root)
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):
                root = _root(node.func.value)
                if root is not None:
                    changed.add(root)
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if isinstance(arg, ast.Starred):
                    arg = arg.value
                if isinstance(arg, ast.Name):
                    changed.add(arg.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            wrote.add(node.name)
        elif isinstance(node, ast.alias):
            wrote.add((node.asname or node.name).partition(".")[0])
        elif isinstance(node, ast.Global):
            wrote.update(node.names)
    return wrote, changed


def _plain_name(name: str) -> bool:
    """A file name kernelexec writes in the checkpoint directory (no separator, no leading dot)."""
    return 0 < len(name) <= 200 and os.sep not in name and not name.startswith(".") and "\0" not in name


class _OverCap(Exception):
    """A value's pickle went past the room left under the checkpoint cap (args[0]: that room)."""


def _contains(data: Any, needles: list[bytes]) -> bool:
    """One of ``needles`` in ``data`` (a bytes-like write), read 1 MiB at a time with an overlap: a large buffer is
    never copied whole."""
    view = memoryview(data).cast("B")
    overlap = max(len(n) for n in needles) - 1
    step = 1 << 20
    for start in range(0, len(view), step):
        piece = bytes(view[start:start + step + overlap])
        if any(n in piece for n in needles):
            return True
    return False


class _HoldsSecret(Exception):
    """A value's pickle holds a getpass() answer: a secret is never written to disk."""


class _Superseded(Exception):
    """A cell started (or ran) while a value was being pickled: the file may not be what the namespace held at the
    save's start (the cell may change the object in place), so it is dropped and the value saved again after it."""


class _Capped:
    """A file's write, counted: past ``room`` bytes it raises _OverCap (pickle.dump stops at once); holding one of
    ``secrets`` (getpass() answers, UTF-8: pickle writes a str whole within one write) it raises _HoldsSecret; once
    ``stop()`` says a cell has started, it raises _Superseded."""

    def __init__(self, fh: Any, room: int, secrets: list[bytes] | None = None, stop: Any = None) -> None:
        self.fh, self.room, self.size, self.secrets, self.stop = fh, room, 0, secrets or [], stop

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self.size + len(view) > self.room:
            raise _OverCap(max(self.room, 0))
        if self.secrets and _contains(view, self.secrets):
            raise _HoldsSecret()
        # a large buffer (an array's, in pickle protocol 5) is written in pieces, the GIL released during each:
        # a cell that starts meanwhile stops the save within one piece, not after the whole buffer
        for start in range(0, max(len(view), 1), WRITE_PIECE):
            if self.stop is not None and self.stop():
                raise _Superseded()
            self.size += self.fh.write(view[start:start + WRITE_PIECE])
        return len(view)


STALE = "changed by a cell after its last save, not saved again yet"
WRITE_PIECE = 4 << 20  # bytes per write of a save: a starting cell waits for one piece at most (a few ms)
# seconds the kernel stays quiet (no cell) after an answer before a save starts, once a cell has stopped a save:
# in a loop of calls each next cell would stop it again, its work thrown away after it competed with that cell for
# memory and disk. A save no cell stopped starts at once (small values are written before the next call arrives).
QUIET_S = 0.2


class Checkpointer:
    """One kernel's checkpoints. Inactive until the server calls ``restore`` or ``reset`` (a new
    process must not overwrite the checkpoint it has not loaded).

    Saving never delays the next cell, nor an answer but by one manifest write when a cell rebinds or deletes a
    saved name. ``post_run_cell`` notes which objects changed (the newest value of a name supersedes one still
    waiting), names a saved name the cell rebound unsaved in the manifest at once (and drops one it deleted), and
    wakes one saver thread, which starts once the kernel has published the cell's idle status (the answer is out:
    ``watch_answers``). A save reads objects only while no cell runs: a cell starting (``pre_run_cell``) makes the
    save in progress drop the file it is writing at its next write (``_Superseded``); the names it had not finished
    wait for the next quiet moment. A snapshot is therefore
    always what the namespace held between two cells, without copying it and without forking (seccomp refuses
    fork to guarded kernels). While a name waits, the manifest names it unsaved (``STALE``): a death then recomputes
    it from its cells instead of loading an older value."""

    def __init__(self, shell: Any, policy: dict[str, Any], bypass: Any) -> None:
        self.shell = shell
        self.dir: str | None = policy.get("checkpoint_dir")
        self.cap = int(policy.get("checkpoint_cap") or 0)
        self.bypass = bypass
        # inactive until the server loads or drops an existing checkpoint; a session without one starts active
        self.active = bool(self.dir) and not self._exists(MANIFEST)
        self.entries: dict[str, dict[str, Any]] = {}  # name -> {"file", "bytes"} | {"module"}
        self.unsaved: dict[str, str] = {}  # name -> why it was not saved
        # the objects the names held after the last cell: held (not their id()s, which a new object could reuse),
        # so an object is compared by identity; a deleted one is freed at the end of the next cell
        self.seen: dict[str, Any] = {}
        self.not_names: set[Any] = set()  # keys of the namespace that are not user names (``_user_names``)
        self.seq = 0
        self.error: str | None = None
        self.secrets: list[bytes] = []  # this kernel's getpass() answers (kernel_init): never saved
        # the saver's state, under ``cond``: what waits to be saved, whether a cell runs, whether its answer is out
        self.cond = threading.Condition()
        self.manifest_lock = threading.RLock()  # one manifest commit at a time: the saver's, or a cell's end's
        self.pending: dict[str, Any] = {}
        self.pending_gone: set[str] = set()
        self.doomed: list[str] = []  # files no manifest names any more, for the saver to unlink
        self.in_cell = False
        self.cells_started = 0  # a save whose start saw another count may have read objects a cell was changing
        self.answered = True
        self.hurry = False  # the server waits for the saves (``wait``): no quiet period
        self.backoff = False  # the last save was stopped by a cell: wait for QUIET_S without one first
        self.saving = False
        self.watching = False  # watch_answers installed: a save waits for the cell's idle status
        self.thread: threading.Thread | None = None
        self.superseded = 0  # saves a cell interrupted (status)
        self.exported: dict[str, int] = {}  # the files ``export`` offered a fork: only they are read out

    def _exists(self, name: str) -> bool:
        assert self.dir is not None
        try:
            with self.bypass():
                return os.path.lexists(os.path.join(self.dir, name))
        except Exception:  # noqa: BLE001 - no bypass yet (boot): the guard is not installed either
            return os.path.lexists(os.path.join(self.dir, name))

    def watch_answers(self, kernel: Any) -> None:
        """Saves start once the kernel has sent a cell's idle status (after its execute_reply): wraps the kernel
        session's ``send`` (jupyter_client's public Session API), which every reply and status goes through."""
        session = getattr(kernel, "session", None)
        send = getattr(session, "send", None)
        if session is None or send is None:
            return

        def send_then_wake(stream: Any, msg_or_type: Any, content: Any = None, *args: Any, **kwargs: Any) -> Any:
            sent = send(stream, msg_or_type, content, *args, **kwargs)
            if msg_or_type == "status" and isinstance(content, dict) and content.get("execution_state") == "idle":
                self._answered()
            return sent

        session.send = send_then_wake
        self.watching = True

    def _answered(self) -> None:
        with self.cond:
            if not self.answered:
                self.answered = True
                self.cond.notify_all()

    # --- which names changed -------------------------------------------------------------
    def _user_names(self) -> dict[str, Any]:
        """The user's names and their objects. IPython adds names to the namespace every cell (``_i<n>``, and
        ``_<n>`` for an output), never user names: each is remembered once as not a name (``not_names``) and passed
        over in C (``filterfalse`` with the set's own membership test), where every key used to be tested in Python,
        which made each cell slower the longer the session (~0.5 ms a cell after 5,000). Only exact ``str`` keys are
        remembered: a key that is no string (``globals()[1] = ...``) or a ``str`` subclass is tested each time (read
        through ``str``'s own methods) and never kept alive here."""
        ns, hidden, not_names = self.shell.user_ns, self.shell.user_ns_hidden, self.not_names
        names: dict[str, Any] = {}
        for k in filterfalse(not_names.__contains__, ns):
            if not isinstance(k, str) or str.startswith(k, "_") or not str.isidentifier(k):
                if type(k) is str:
                    not_names.add(k)  # never a name, whatever it is bound to later
            elif k not in hidden:  # IPython's own (In, Out, exit): hidden can change, so asked each time
                value = ns.get(k, _GONE)  # a thread of the user's may delete it meanwhile
                if value is not _GONE:
                    names[k] = value
        return names

    def pre_run_cell(self, info: Any) -> None:
        """A cell starts: a save in progress stops reading objects at its next write (never waited for)."""
        self.in_cell = True
        self.cells_started += 1

    def wait(self) -> None:
        """Every change noted so far saved (the server's calls: status before a fork, restore, pause, reset)."""
        with self.cond:
            # the server asks between cells (nothing of a cell's left to send), or a cell asks and is blocked here:
            # either way nothing changes the namespace until the saves are done
            in_cell, self.in_cell, self.answered, self.hurry = self.in_cell, False, True, True
            self.cond.notify_all()
            try:
                while self.pending or self.pending_gone or self.saving:
                    self.cond.wait()
            finally:
                self.in_cell, self.hurry = in_cell, False

    def post_run_cell(self, outcome: Any) -> None:
        with self.cond:
            self.in_cell = False
        if not self.active or not self.dir or self.cap <= 0:
            return
        try:
            ns = self._user_names()
            cell = getattr(getattr(outcome, "info", None), "raw_cell", "") or ""
            found = _names(cell) if cell else (set(), set())
            old = self.seen
            new = ns
            rebound = {k for k, v in new.items() if k not in old or old[k] is not v}
            changed = set(rebound)
            if found is None:
                changed = set(new)  # a cell we cannot read (magics): everything may have changed
            else:
                # perhaps changed in place (df.drop(..., inplace=True), lst.append, f(lst)); a name bound again
                # to the same object (x = 1 again) is not saved again
                changed |= found[1] & set(new)
            gone = (set(self.entries) | set(self.unsaved) | set(self.pending)) - set(new)
            self.seen = new
            if not changed and not gone:
                return  # x = 1 again with the same object, print(...): nothing to save
            with self.cond:
                for k in gone:
                    self.pending.pop(k, None)
                self.pending.update({k: ns[k] for k in changed})  # the newest object of a name supersedes
                self.pending_gone = (self.pending_gone | gone) - changed
                self.answered = not self.watching
                self.cond.notify_all()
            with self.manifest_lock:  # the saver's commit either came before (its entries seen here) or sees pending
                if rebound & set(self.entries) or gone & (set(self.entries) | set(self.unsaved)):
                    # a saved name bound to another object, or deleted: the manifest says so before the answer leaves,
                    # so a death before the saver gets to it reruns this cell rather than load the older value (the
                    # saver may be busy with an earlier cell's names, or wait for a quiet kernel while cells keep
                    # coming). Names a call or a method may have changed in place (df.head(), f(x)) wait for the saver
                    # as before: a manifest write on most cells would cost every answer
                    self._commit()
            self._start()
        except Exception as exc:  # noqa: BLE001 - a checkpoint never breaks a cell
            self.error = repr(exc)[:300]

    def _start(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            return
        thread = threading.Thread(target=self._saver, name="kernelexec-checkpoint", daemon=True)
        thread.start()  # RuntimeError (no thread to be had): noted by the caller, tried again after the next cell
        self.thread = thread

    # --- saving (the background thread) -------------------------------------------------------
    def _saver(self) -> None:
        """The one saver thread: waits for changes, a quiet kernel (no cell running, the answer out), saves."""
        while True:
            with self.cond:
                while not self._quiet():
                    self.cond.wait()
                values, gone = self.pending, self.pending_gone
                self.pending, self.pending_gone = {}, set()
                self.saving = True
            left: dict[str, Any] = {}
            try:
                left = self._save_now(values, gone)
            except Exception as exc:  # noqa: BLE001 - the last good manifest stays
                self.error = repr(exc)[:300]
            with self.cond:
                doomed, self.doomed = self.doomed, []
            self._remove(doomed)
            with self.cond:
                self.saving = False
                self.backoff = bool(left)  # a cell stopped this save: the next one waits for a quiet kernel
                for k, v in left.items():
                    self.pending.setdefault(k, v)  # a newer object of the name, noted meanwhile, wins
                self.cond.notify_all()

    def _quiet(self) -> bool:
        """Something to save, the answer out, no cell running; after a save a cell stopped (``backoff``), also none
        started for ``QUIET_S`` (unless the server waits for the save: ``hurry``). Called with ``cond`` held."""
        while (self.pending or self.pending_gone) and self.answered and not self.in_cell:
            if self.hurry or not self.backoff:
                return True
            started = self.cells_started
            self.cond.wait(QUIET_S)  # pre_run_cell does not notify (it never waits): the count says
            if self.cells_started == started and not self.in_cell:
                return True
        return False

    def _save_now(self, values: dict[str, Any], gone: set[str]) -> dict[str, Any]:
        """Save ``values`` and forget ``gone``; returns the values a cell's start left unsaved."""
        assert self.dir is not None
        entries = {k: v for k, v in self.entries.items() if k not in gone and k not in values}
        unsaved = {k: v for k, v in self.unsaved.items() if k not in gone and k not in values}
        drop = [e["file"] for k, e in self.entries.items() if "file" in e and (k in gone or k in values)]
        self.seq += 1
        quiet = self.cells_started
        if any(not isinstance(v, _SKIP_TYPES) for v in values.values()):
            # until they are written, the old files do not hold these names' values: a death meanwhile recomputes them
            self._commit(entries, {**unsaved, **{k: STALE for k in values}})
        left: dict[str, Any] = {}
        written: list[str] = []
        total = sum(e.get("bytes", 0) for e in entries.values())
        for name in sorted(values):
            value = values[name]
            if left or self._interrupted(quiet):
                left[name] = value
                unsaved[name] = STALE
                continue
            if isinstance(value, _SKIP_TYPES):
                entries[name] = {"module": value.__name__}
                continue
            if isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == "__main__":
                unsaved[name] = "defined in a cell"
                continue
            file = f"{name}.{os.urandom(6).hex()}.{self.seq}.pkl"  # never a name an older manifest uses
            try:
                size, modules = self._dump(file, value, self.cap - total, quiet)
            except _Superseded:
                self.superseded += 1
                left[name] = value
                unsaved[name] = STALE
                continue
            except _HoldsSecret:
                unsaved[name] = "holds a getpass() answer (a secret is never written to disk)"
                continue
            except _OverCap as over:
                unsaved[name] = f"over the checkpoint cap (more than {over.args[0]:,} bytes; {total:,} of {self.cap:,} used)"
                continue
            except Exception as exc:  # noqa: BLE001 - open files, sockets, generators, locks, ...
                unsaved[name] = f"cannot be pickled ({type(exc).__name__}: {str(exc)[:120]})"
                continue
            written.append(file)
            entries[name] = {"file": file, "bytes": size}
            sources = _sources(modules)
            if sources:
                entries[name]["sources"] = sources
            total += size
        self._commit(entries, unsaved)
        self._remove([f for f in drop if f not in written])
        return left

    def _commit(self, entries: dict[str, dict[str, Any]] | None = None, unsaved: dict[str, str] | None = None) -> None:
        """The manifest written (atomically), then taken as this kernel's own (None: the current one again). A name a
        cell changed since (``pending``) is never written with the file of its older value: it is named unsaved
        (STALE) until its own save, and that file goes (``doomed``: the saver unlinks it); one a cell deleted goes
        with its file. The saver and a cell's end both commit, one at a time."""
        with self.manifest_lock:
            if entries is None or unsaved is None:
                entries, unsaved = dict(self.entries), dict(self.unsaved)
            with self.cond:
                newer = set(self.pending) & set(entries)
                deleted = self.pending_gone & (set(entries) | set(unsaved))
            dropped = newer | deleted
            older = [e["file"] for k, e in entries.items() if k in dropped and "file" in e]
            entries = {k: v for k, v in entries.items() if k not in dropped}
            unsaved = {**{k: v for k, v in unsaved.items() if k not in deleted}, **{k: STALE for k in newer}}
            total = sum(e.get("bytes", 0) for e in entries.values())
            manifest = {"version": 1, "vars": entries, "unsaved": unsaved, "bytes": total, "cap": self.cap}
            try:
                self._write(MANIFEST, json.dumps(manifest).encode())
            except OSError:
                # (a full disk) the manifest on disk still names files this one no longer does: older values of names
                # changed since, rebound or in place. They go now (on the answer's path, but only on this failure), so
                # that a death loads none of them and a restore names them as not loaded; this kernel's own view is
                # the manifest it could not write, so that its status says so and its next commit writes it
                named = {e["file"] for e in entries.values() if "file" in e}
                self._remove(sorted(({e["file"] for e in self.entries.values() if "file" in e} - named) | set(older)))
                self.entries, self.unsaved = dict(entries), dict(unsaved)
                raise
            self.entries, self.unsaved = dict(entries), dict(unsaved)
            if older:
                with self.cond:  # unlinked by the saver, never on a cell's answer (a GB file takes ~50 ms here)
                    self.doomed.extend(older)

    def _atomic(self, name: str, fill: Any) -> Any:
        """``fill(fh)`` into ``name``'s temp file, then renamed onto it (a kill mid-write leaves the last good file);
        nothing left behind on a failure. Returns what ``fill`` returned. Only the open, rename and unlink run under
        the guard's bypass: ``fill`` pickles user objects, whose ``__reduce__`` is a cell's code and stays guarded."""
        assert self.dir is not None
        path = os.path.join(self.dir, name)
        tmp = path + ".tmp"
        with self.bypass():
            os.makedirs(self.dir, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                done = fill(fh)
            with self.bypass():
                os.replace(tmp, path)
        except BaseException:
            with self.bypass():
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            raise
        return done

    def _interrupted(self, quiet: int) -> bool:
        """A cell runs, or ran, since the save that saw ``quiet`` cells started."""
        return self.in_cell or self.cells_started != quiet

    def _dump(self, name: str, value: Any, room: int, quiet: int) -> tuple[int, set[str]]:
        """Pickle ``value`` straight into the file ``name``, never whole in memory: a large array's or bytes' buffer
        goes to the file as it is, so a save does not double the kernel's peak memory. Past ``room`` bytes it stops
        (_OverCap) and leaves nothing; a cell that started before its last write returned (or ran while a
        ``__reduce__`` between two writes took its time) leaves nothing either
        (_Superseded). Its size, and the modules its classes and functions come from."""
        def stop() -> bool:
            return self._interrupted(quiet)

        def fill(fh: Any) -> tuple[int, set[str]]:
            out = _Capped(fh, room, list(self.secrets), stop)
            pickler = _Pickler(out)
            pickler.dump(value)
            if stop():  # a cell started during the last write: it may hold half-changed memory
                raise _Superseded()
            return out.size, pickler.modules

        found: tuple[int, set[str]] = self._atomic(name, fill)
        return found

    def _write(self, name: str, data: bytes) -> None:
        self._atomic(name, lambda fh: fh.write(data))

    def _remove(self, files: list[str]) -> None:
        assert self.dir is not None
        with self.bypass():
            for file in files:
                try:
                    os.unlink(os.path.join(self.dir, file))
                except OSError:
                    pass

    # --- the server's calls -------------------------------------------------------------
    def _read(self, name: str) -> bytes:
        assert self.dir is not None
        with self.bypass():  # reading only, and only our own directory (no symlink followed)
            fd = os.open(os.path.join(self.dir, name), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                return fh.read()

    def reset(self) -> Any:
        """A clean kernel by the user's wish (a plain restart): the old checkpoint is dropped."""
        with self.cond:
            self.pending, self.pending_gone = {}, set()
        self.wait()
        with self.manifest_lock:  # as every manifest write: one at a time
            old = [e["file"] for e in self.entries.values() if "file" in e]
            self.entries, self.unsaved, self.seen, self.exported = {}, {}, {}, {}
            self.active = True
            if self.dir:
                try:
                    self._write(MANIFEST, json.dumps({"version": 1, "vars": {}, "unsaved": {}, "bytes": 0}).encode())
                    with self.bypass():
                        old += [f for f in os.listdir(self.dir) if f.endswith((".pkl", ".tmp", ".part"))]
                    self._remove(sorted(set(old)))
                except OSError as exc:
                    self.error = repr(exc)[:300]
        return {"reset": True}

    def restore(self, names: list[str] | None = None) -> dict[str, Any]:
        """Load the checkpoint (or only ``names`` of it) into the namespace, here, under the guard.
        What was not saved or does not load is named, never hidden."""
        self.wait()
        restored: list[str] = []
        failed: dict[str, str] = {}
        unsaved: dict[str, str] = {}
        manifest: Any = None
        if self.dir:
            try:
                manifest = json.loads(self._read(MANIFEST))
            except FileNotFoundError:
                manifest = None
            except Exception as exc:  # noqa: BLE001 - a forged or broken manifest: reported
                failed["*"] = f"the checkpoint's manifest is unreadable ({type(exc).__name__})"
        entries: dict[str, Any] = {}
        if isinstance(manifest, dict):
            found = manifest.get("vars")
            if isinstance(found, dict):
                entries = {k: v for k, v in found.items() if isinstance(k, str) and k.isidentifier() and isinstance(v, dict)}
            why = manifest.get("unsaved")
            if isinstance(why, dict):
                unsaved = {k: str(v)[:200] for k, v in why.items() if isinstance(k, str) and k.isidentifier()}
        elif manifest is not None:
            failed["*"] = "the checkpoint's manifest is not an object"
        ns = self.shell.user_ns
        kept: dict[str, dict[str, Any]] = {}
        for name, entry in entries.items():
            if names is not None and name not in names:
                kept[name] = entry
                continue
            try:
                if isinstance(entry.get("module"), str):
                    value = __import__(entry["module"], fromlist=["_"])  # through the guard, as a cell's import
                elif isinstance(entry.get("file"), str) and _plain_name(entry["file"]):
                    changed = _changed(entry.get("sources"))
                    if changed is not None:
                        raise ValueError(f"its module {changed} changed since the save")
                    value = pickle.loads(self._read(entry["file"]))  # outside the bypass: the guard holds
                else:
                    raise ValueError("not an entry kernelexec writes")
            except BaseException as exc:  # noqa: BLE001 - a forged pickle may raise anything, SystemExit too
                if isinstance(exc, KeyboardInterrupt):
                    raise
                failed[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
                continue
            ns[name] = value
            kept[name] = entry
            restored.append(name)
        if names is None:
            self.entries = {k: v for k, v in kept.items() if "bytes" in v and isinstance(v["bytes"], int) or "module" in v}
            self.unsaved = {k: v for k, v in unsaved.items() if k not in self.entries}
            self.seen = self._user_names()
            self.active = True
        else:
            self.seen.update({k: ns[k] for k in restored})
        return {"restored": sorted(restored), "failed": failed,
                "unsaved": {k: v for k, v in unsaved.items() if names is None or k in names}}

    # --- a fork: the checkpoint from this kernel to another, through the kernels, never read by the host ----
    def export(self) -> dict[str, Any]:
        """Every change saved, then the files a fork needs: the manifest and the pickles it names, as
        ``[[name, size]]`` (regular files only, no link followed). ``read_chunk`` serves them to the server,
        which hands the bytes, unread, to the fork's kernel (``receive``)."""
        self.wait()
        self.exported = {}
        files: list[list[Any]] = []
        if not self.dir or not self._exists(MANIFEST):
            return {"files": files}
        manifest = json.loads(self._read(MANIFEST))
        found = manifest.get("vars") if isinstance(manifest, dict) else None
        names = [e["file"] for e in (found or {}).values()
                 if isinstance(e, dict) and isinstance(e.get("file"), str) and _plain_name(e["file"])]
        for name in [MANIFEST, *sorted(set(names))]:
            try:
                with self.bypass():
                    fd = os.open(os.path.join(self.dir, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError as exc:  # ELOOP: a link planted in the directory
                raise ValueError(f"checkpoint file {name!r} is not a regular file ({exc.strerror})") from None
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"checkpoint file {name!r} is not a regular file")
            self.exported[name] = st.st_size
            files.append([name, st.st_size])
        return {"files": files}

    def serve_relay(self, comm: Any, opened: Any) -> None:
        """The comm target ``COMM_TARGET`` (registered by kernel_init): a fork's relay, the server's requests on one
        comm, each answered on it. ``{"op": "read", "name", "offset", "size"}``: that piece of an exported file, as
        one binary buffer; ``{"op": "write", "name", "offset"}`` with one buffer: written by ``receive``. Any
        refusal is the answer's ``error``. The bytes are never encoded nor parsed here or on the host."""
        def answer(msg: Any) -> None:
            content = msg.get("content") if isinstance(msg, dict) else None
            request = content.get("data") if isinstance(content, dict) else None
            try:
                if not isinstance(request, dict):
                    raise ValueError("not a relay request")
                op, name, offset = request.get("op"), request.get("name"), request.get("offset")
                if not (isinstance(name, str) and isinstance(offset, int) and offset >= 0):
                    raise ValueError("a relay request names a file and an offset")
                if op == "read" and isinstance(request.get("size"), int):
                    piece = self.read_chunk(name, offset, request["size"])
                    comm.send({"bytes": len(piece)}, buffers=[piece])
                    return
                buffers = msg.get("buffers") or []
                if op == "write" and len(buffers) == 1:
                    comm.send(self.receive(name, offset, buffers[0]))
                    return
                raise ValueError(f"not a relay request: {str(op)[:40]!r}")
            except Exception as exc:  # noqa: BLE001 - refused: said on the comm, the server reports it
                comm.send({"error": f"{type(exc).__name__}: {str(exc)[:200]}"})

        comm.on_msg(answer)
        comm.send({"ready": True})

    def read_chunk(self, name: str, offset: int, size: int) -> bytes:
        """``size`` bytes of an exported file from ``offset`` (fewer at its end), as they are on disk."""
        if name not in self.exported:
            raise ValueError(f"{name!r} was not exported")
        if not 0 <= size <= 64 << 20:
            raise ValueError("a piece of at most 64 MiB")
        assert self.dir is not None
        with self.bypass():
            fd = os.open(os.path.join(self.dir, name), os.O_RDONLY | os.O_NOFOLLOW)
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)

    def receive(self, name: str, offset: int, data: Any) -> dict[str, Any]:
        """A piece of another kernel's checkpoint (its fork's source, bytes-like), written at ``offset`` of
        ``name``.part; ``received`` puts the whole in place. Refused once this kernel has a checkpoint of its own."""
        if not self.dir or not _plain_name(name) or self.entries:
            raise ValueError("a checkpoint is received only by a new fork's kernel, under a plain file name")
        with self.bypass():
            os.makedirs(self.dir, exist_ok=True)
            fd = os.open(os.path.join(self.dir, name + ".part"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data).cast("B")
            done = 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], offset + done)
        finally:
            os.close(fd)
        return {"bytes": done}

    def received(self, names: list[str]) -> dict[str, Any]:
        """Every piece is here: the pickles renamed into place, then the manifest (so a kill in between leaves no
        manifest naming a missing file). ``restore`` loads them next."""
        assert self.dir is not None
        ordered = sorted((n for n in names if _plain_name(n)), key=lambda n: n == MANIFEST)
        with self.bypass():
            for name in ordered:
                os.replace(os.path.join(self.dir, name + ".part"), os.path.join(self.dir, name))
        self.active = False  # the received checkpoint is loaded by restore before anything saves over it
        return {"received": len(ordered)}

    def pause(self) -> dict[str, Any]:
        """Cells rerun to recompute what the checkpoint lacked save nothing until ``resume``, so the
        checkpoint's files stay as they were while names those cells clobbered are loaded again."""
        self.wait()
        self.active = False
        return {"paused": True}

    def resume(self) -> dict[str, Any]:
        """Save what changed since ``restore`` (the recomputed names: named unsaved again if they cannot be)."""
        self.active = True

        class _Done:
            info = None

        self.post_run_cell(_Done())  # no cell text: every name whose object changed
        return {"resumed": True}

    def status(self) -> dict[str, Any]:
        self.wait()
        return {"active": self.active, "saved": sorted(self.entries), "unsaved": dict(self.unsaved),
                "bytes": sum(e.get("bytes", 0) for e in self.entries.values()), "cap": self.cap, "error": self.error,
                "superseded": self.superseded}
