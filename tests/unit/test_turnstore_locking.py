"""The turn table on SQLite is written by the guard, the executors and the model service: a write that
finds the file locked by another process must wait off the event loop, never stall it."""

from __future__ import annotations

import asyncio
import sqlite3
import time

from sqlalchemy import update

from services.kernel.turnstore import TurnStore, turns


async def test_a_locked_file_does_not_stall_the_event_loop(tmp_path):
    path = tmp_path / "ledger.db"
    store = await TurnStore.open(f"sqlite:///{path}")
    other = sqlite3.connect(path, isolation_level=None)  # another process, as far as SQLite can tell
    try:
        other.execute("BEGIN IMMEDIATE")  # it holds the write lock
        write = asyncio.create_task(store._update(update(turns).where(turns.c.turn_id == "t").values(step=1)))
        ticks, started = 0, time.monotonic()
        while time.monotonic() - started < 0.3:  # the loop keeps running meanwhile
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks >= 15 and not write.done()  # the write waits for the lock, the loop does not
        other.execute("COMMIT")
        assert await asyncio.wait_for(write, 5) is False  # done once the lock is free (no such row: rowcount 0)
    finally:
        other.close()
        await store.close()
