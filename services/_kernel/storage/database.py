"""The engines on the fleet's own databases (the turn table, the conversation store): SQLite inline, PostgreSQL by
asyncpg.

A SQLite file by default (one file in state_dir, shared by the local processes), PostgreSQL by URL.
`read_only` engines (the CLI's listings) cannot write: SQLite opens the file in mode=ro (a missing
file is an error, not a new empty database), PostgreSQL runs every transaction read only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from roundtrip._kernel.settings.concerns import POOL_SIZE as POOL_SIZE  # re-exported: the stores' default
from roundtrip._kernel.settings.display import without_passwords

JOURNAL_LIMIT_BYTES = 64 * 1024 * 1024
T = TypeVar("T")  # what a unit of work returns


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def shown(url: str) -> str:
    """The URL as logs and messages may show it: its password hidden (the rule `roundtrip config` follows too)."""
    return without_passwords(url)


def make_engine(url: str, read_only: bool = False, pool_size: int = POOL_SIZE) -> Engine | AsyncEngine:
    """SQLite: a plain engine, used inline on the event loop (a WAL commit without fsync takes
    microseconds; a thread hop per statement costs more than the statement), without waiting for
    a lock there: the guard, the executors and the model service write to one file, and a write
    that finds it locked is retried in a thread that may wait (`TurnStore._run`), so another
    process's write never stalls this one's event loop. PostgreSQL: asyncpg, on a pool of `pool_size`
    connections kept open and no more: a statement that finds them all in use waits for one. An
    overflow connection (opened for one statement, closed after it) costs a server process, its
    authentication and the connection's prepared statements: under load, far more than the wait
    (docs/decisions/ledger-statements.md)."""
    if is_sqlite(url):
        parsed = make_url(url).set(drivername="sqlite")
        path = parsed.database or ""
        if read_only:
            parsed = parsed.set(database=f"file:{path}", query={**parsed.query, "mode": "ro", "uri": "true"})
        elif path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(conn: Any, _record: Any) -> None:  # WAL: readers (roundtrip turns) never block the guard
            cur = conn.cursor()
            if not read_only:  # a read-only connection cannot change the journal (the writers made it WAL)
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            # a checkpointed WAL is cut back to this size, not kept at its largest burst (services/_guard/retention.py)
            cur.execute(f"PRAGMA journal_size_limit={JOURNAL_LIMIT_BYTES}")
            cur.execute("PRAGMA busy_timeout=0")  # on the event loop: fail at once when locked (see TurnStore._run)
            cur.close()

        return engine
    if read_only:
        return create_async_engine(
            url,
            pool_size=1,
            max_overflow=0,  # its readers run one statement at a time
            connect_args={"server_settings": {"default_transaction_read_only": "on"}},
        )
    return create_async_engine(url, pool_size=pool_size, max_overflow=0)


async def run_on(engine: Engine | AsyncEngine, work: Callable[[Connection], T], write: bool = False) -> T:
    """`work(connection)` in one transaction (committed when `write`) on either kind of engine, which is disposed after:
    for the occasional job (a migration, a reading), not the hot path (`TurnStore._run`)."""
    try:
        if isinstance(engine, AsyncEngine):
            async with engine.begin() if write else engine.connect() as conn:
                return await conn.run_sync(work)
        with engine.begin() if write else engine.connect() as conn:
            return work(conn)
    finally:
        if isinstance(engine, AsyncEngine):
            await engine.dispose()
        else:
            engine.dispose()
