"""The carrier's line system, as this example has it: a SQLite file every process of the fleet opens (the gate reads
lines, the executor changes them), seeded with three customers the first time.

A line has one account holder and, on a family plan, members. `line_for(customer, line)` answers only a holder or
a member (with `your_role`), and None for anyone else or an id that does not exist: the two look the same.
Calls run in a worker thread (sqlite3 blocks); one connection per process, closed by `aclose()` at shutdown.
"""

from __future__ import annotations

import asyncio
import fcntl
import secrets
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS lines (line_id TEXT PRIMARY KEY, number TEXT NOT NULL, holder_id TEXT NOT NULL,
    plan TEXT NOT NULL, status TEXT NOT NULL, data_used_mb INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS members (line_id TEXT NOT NULL, customer_id TEXT NOT NULL,
    PRIMARY KEY (line_id, customer_id));
CREATE TABLE IF NOT EXISTS port_outs (idempotency_key TEXT PRIMARY KEY, line_id TEXT NOT NULL,
    new_carrier TEXT NOT NULL, transfer_code TEXT NOT NULL);
"""
# Alice holds a family line Bob shares; Bob and Carol each hold one of their own.
SEED_LINES = [
    ("ln_5550101", "+1 555 0101", "cus_2001", "plus", "active", 3100),
    ("ln_5550202", "+1 555 0202", "cus_2002", "basic", "active", 800),
    ("ln_5550303", "+1 555 0303", "cus_2003", "unlimited", "active", 12400),
]
SEED_MEMBERS = [("ln_5550101", "cus_2002")]
COLUMNS = ("line_id", "number", "holder_id", "plan", "status", "data_used_mb")


class Carrier:
    def __init__(self, path: Path | str) -> None:
        self._db = sqlite3.connect(str(path), timeout=10, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        # Every process of a starting fleet opens the file at once, and SQLite answers a second journal-mode switch
        # "database is locked" without waiting its timeout: the first open is serialized on a lock file.
        with open(f"{path}.lock", "a") as held, self._lock:
            fcntl.flock(held, fcntl.LOCK_EX)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(SCHEMA)
            self._db.executemany("INSERT OR IGNORE INTO lines VALUES (?, ?, ?, ?, ?, ?)", SEED_LINES)
            self._db.executemany("INSERT OR IGNORE INTO members VALUES (?, ?)", SEED_MEMBERS)

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def locked() -> T:
            with self._lock:
                return work(self._db)

        return await asyncio.to_thread(locked)

    async def aclose(self) -> None:
        await self._run(lambda db: db.close())

    @staticmethod
    def _visible(db: sqlite3.Connection, customer_id: str, where: str = "", *args: Any) -> list[dict[str, Any]]:
        rows = db.execute(
            f"SELECT {', '.join('l.' + c for c in COLUMNS)}, "
            "CASE WHEN l.holder_id = ? THEN 'holder' ELSE 'member' END FROM lines l "
            "WHERE (l.holder_id = ? OR EXISTS (SELECT 1 FROM members m WHERE m.line_id = l.line_id "
            "AND m.customer_id = ?))"
            f"{where} ORDER BY l.line_id",
            (customer_id, customer_id, customer_id, *args),
        ).fetchall()
        return [dict(zip((*COLUMNS, "your_role"), row, strict=True)) for row in rows]

    async def lines_of(self, customer_id: str) -> list[dict[str, Any]]:
        return await self._run(lambda db: self._visible(db, customer_id))

    async def line_for(self, customer_id: str, line_id: str) -> dict[str, Any] | None:
        found = await self._run(lambda db: self._visible(db, customer_id, " AND l.line_id = ?", line_id))
        return found[0] if found else None

    async def change_plan(self, holder_id: str, line_id: str, plan: str) -> dict[str, Any] | None:
        """The line on its new plan; None unless `holder_id` holds it."""

        def change(db: sqlite3.Connection) -> None:
            db.execute("UPDATE lines SET plan = ? WHERE line_id = ? AND holder_id = ?", (plan, line_id, holder_id))

        await self._run(change)
        line = await self.line_for(holder_id, line_id)
        return line if line is not None and line["your_role"] == "holder" else None

    async def port_out(
        self, holder_id: str, line_id: str, new_carrier: str, idempotency_key: str
    ) -> dict[str, Any] | None:
        """The port-out request (the same one for a repeated key); None unless `holder_id` holds an active line."""

        def port(db: sqlite3.Connection) -> dict[str, Any] | None:
            done = db.execute(
                "SELECT line_id, new_carrier, transfer_code FROM port_outs WHERE idempotency_key = ?",
                (idempotency_key,),
            ).fetchone()
            if done is None:
                db.execute("BEGIN IMMEDIATE")
                moved = db.execute(
                    "UPDATE lines SET status = 'ported_out' WHERE line_id = ? AND holder_id = ? AND status = 'active'",
                    (line_id, holder_id),
                ).rowcount
                if not moved:
                    db.execute("ROLLBACK")
                    return None
                done = (line_id, new_carrier, secrets.token_hex(4).upper())
                db.execute("INSERT INTO port_outs VALUES (?, ?, ?, ?)", (idempotency_key, *done))
                db.execute("COMMIT")
            return dict(zip(("line_id", "new_carrier", "transfer_code"), done, strict=True))

        return await self._run(port)
