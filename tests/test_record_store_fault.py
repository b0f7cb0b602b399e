"""The record never diverges from the session store (review finding 4): a store write that fails is tried again,
then the call fails plainly, and nothing is recorded only in the file. Before, one failure dropped the store for
good: the cells after it went to journal.jsonl alone, and a fleet's next takeover (``write_journal`` from the
store) erased them. The fault is a real one: another connection holds SQLite's write lock."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from kernelexec.session.recording import NotRecorded, Recorder
from kernelexec.store.sqlite import SQLiteStore

HANDLE = "s-fault"


def recorder_over(tmp_path: Path) -> tuple[Recorder, SQLiteStore]:
    store = SQLiteStore.open_sync(tmp_path / "kernelexec.db")
    assert store._conn is not None
    store._conn.execute("PRAGMA busy_timeout=50")  # a held lock fails a write at once (the fault), not after 30 s
    session = tmp_path / HANDLE
    session.mkdir()
    recorder = Recorder(session / "journal.jsonl", session / "notebook.ipynb", {"session": HANDLE},
                        sink=lambda record: store.append_journal_sync(HANDLE, record))
    recorder.start()
    return recorder, store


@contextmanager
def write_lock_held(path: Path, seconds: float) -> Iterator[None]:
    """Another process's view of the store: a connection holding SQLite's write lock for ``seconds``."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    timer = threading.Timer(seconds, lambda: other.execute("ROLLBACK"))
    timer.start()
    try:
        yield
    finally:
        timer.join()
        other.close()


def texts_in_file(recorder: Recorder) -> list[str]:
    return [cell["source"] for cell in recorder.cells()]


def texts_in_store(store: SQLiteStore) -> list[str]:
    entries = anyio.run(store.journal, HANDLE)
    return [entry.record["source"] for entry in entries]


def test_a_store_that_fails_for_a_moment_is_tried_again_and_keeps_every_cell(tmp_path: Path) -> None:
    recorder, store = recorder_over(tmp_path)
    recorder.mark("restart", "first")
    with write_lock_held(store.path, 0.4):
        recorder.mark("restart", "during the blip")
    recorder.mark("restart", "after")
    assert texts_in_store(store) == texts_in_file(recorder), (texts_in_store(store), texts_in_file(recorder))
    assert len(texts_in_file(recorder)) == 3


def test_a_store_that_stays_down_fails_the_call_and_records_nothing_only_in_the_file(tmp_path: Path) -> None:
    recorder, store = recorder_over(tmp_path)
    recorder.mark("restart", "first")
    started = time.monotonic()
    with write_lock_held(store.path, 4.0), pytest.raises(NotRecorded) as refused:
        recorder.mark("restart", "while the store is down")
    assert time.monotonic() - started < 10
    assert "nothing of it is recorded" in str(refused.value)
    recorder.mark("restart", "after")  # the store is back: recorded in both, in the same order
    assert texts_in_store(store) == texts_in_file(recorder), (texts_in_store(store), texts_in_file(recorder))
    assert not any("down" in text for text in texts_in_file(recorder))
    journal = [json.loads(line) for line in recorder.journal.read_text().splitlines()]
    assert len(journal) == 2
