"""The turn table on SQLite is written by the guard, the executors and the model service: a write that
finds the file locked by another process must wait off the event loop, never stall it."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from types import SimpleNamespace

from sqlalchemy import update

from roundtrip._kernel.storage.turnstore import TurnStore, turns
from tests.databases import migrated
from tests.ledger_steps import advance

T1 = SimpleNamespace(turn_id="t1", customer_id="cus", conversation_id="c")  # its id and principal, as started below


async def test_a_locked_file_does_not_stall_the_event_loop(tmp_path):
    path = tmp_path / "ledger.db"
    store = await TurnStore.open(await migrated(f"sqlite:///{path}"))
    other = sqlite3.connect(path, isolation_level=None)  # another process, as far as SQLite can tell
    try:
        other.execute("BEGIN IMMEDIATE")  # it holds the write lock
        write = asyncio.create_task(store._update(update(turns).where(turns.c.turn_id == "t").values(step=1)))
        ticks, started = 0, time.monotonic()
        while time.monotonic() - started < 0.3:  # the loop keeps running meanwhile
            await asyncio.sleep(0.01)  # the loop's other tasks run meanwhile
            ticks += 1
        assert ticks >= 15 and not write.done()  # the write waits for the lock, the loop does not
        other.execute("COMMIT")
        assert await asyncio.wait_for(write, 5) is False  # done once the lock is free (no such row: rowcount 0)
    finally:
        other.close()
        await store.close()


async def test_every_call_sees_what_another_process_committed_before_it(tmp_path):
    """The store keeps one connection open on SQLite; each call is its own transaction, so a read never
    answers from a snapshot older than the call (another process's commit in between is seen)."""
    from roundtrip._guard.ledger import Ledger

    path = tmp_path / "ledger.db"
    ledger = await Ledger.open(await migrated(f"sqlite:///{path}"))
    other = sqlite3.connect(path, isolation_level=None)
    try:
        assert await ledger.start(
            {"turn_id": "t1", "request_id": "r", "conversation_id": "c", "customer_id": "cus"}, "{}"
        )
        assert (await ledger.get("t1")).step == 0
        other.execute("UPDATE turns SET step = 7 WHERE turn_id = 't1'")  # another process moves the turn
        assert (await ledger.get("t1")).step == 7
        other.execute("UPDATE turns SET step = 8 WHERE turn_id = 't1'")
        assert not await advance(
            ledger,
            T1,
            8,
            {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
            0.0,
            "{}",
            now=time.time(),
        )  # from step 7: no longer there
        assert await advance(
            ledger,
            T1,
            9,
            {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
            0.0,
            "{}",
            now=time.time(),
        )
        assert other.execute("SELECT step FROM turns WHERE turn_id = 't1'").fetchone() == (9,)
    finally:
        other.close()
        await ledger.close()


async def test_a_lock_held_for_an_instant_is_waited_for_on_the_event_loop_not_in_a_thread(tmp_path, monkeypatch):
    """Under load the file is locked for ~0.1 ms at a time by the other processes' writes: a write tries again
    after a short pause on the event loop; a thread (and its GIL hand-offs) only for a lock held longer."""
    path = tmp_path / "ledger.db"
    store = await TurnStore.open(await migrated(f"sqlite:///{path}"))
    other = sqlite3.connect(path, isolation_level=None)
    threads = []
    real = store._run_waiting
    monkeypatch.setattr(store, "_run_waiting", lambda *a: threads.append(a) or real(*a))
    try:
        other.execute(
            "INSERT INTO turns (turn_id, request_id, conversation_id, customer_id, status, step, started_at,"
            " last_progress_at, turn_json, input_tokens, output_tokens, cache_creation_input_tokens,"
            " cache_read_input_tokens, cost_usd, trace_id) VALUES ('t', 'r', 'c', 'cus', 'running', 0, 0, 0, '{}',"
            " 0, 0, 0, 0, 0, '')"
        )
        other.execute("BEGIN IMMEDIATE")
        asyncio.get_running_loop().call_later(0.0002, other.execute, "COMMIT")  # released while the write pauses
        assert await store._update(update(turns).where(turns.c.turn_id == "t").values(step=1)) is True
        assert threads == []
        # a single statement commits by itself: no transaction is left open on the store's connection
        other.execute("BEGIN IMMEDIATE")
        assert other.execute("SELECT step FROM turns WHERE turn_id = 't'").fetchone() == (1,)
        other.execute("COMMIT")
    finally:
        other.close()
        await store.close()
