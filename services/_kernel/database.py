"""The engines on the fleet's own databases: SQLite (the default, shared by the local processes) or PostgreSQL.
A `read_only` engine cannot write: a missing SQLite file is an error, not a new empty database.
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
T = TypeVar("T")


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def shown(url: str) -> str:
    """The URL as logs and messages may show it: its password hidden."""
    return without_passwords(url)


def make_engine(url: str, read_only: bool = False, pool_size: int = POOL_SIZE) -> Engine | AsyncEngine:
    """SQLite: used inline, never waiting for a lock on the event loop. PostgreSQL: `pool_size` connections and no
    overflow: waiting for one costs less than opening one (docs/decisions/ledger-statements.md)."""
    if is_sqlite(url):
        parsed = make_url(url).set(drivername="sqlite")
        path = parsed.database or ""
        if read_only:
            parsed = parsed.set(database=f"file:{path}", query={**parsed.query, "mode": "ro", "uri": "true"})
        elif path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(conn: Any, _record: Any) -> None:  # WAL: readers never block the writers
            cur = conn.cursor()
            if not read_only:  # a read-only connection cannot change the journal
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute(f"PRAGMA journal_size_limit={JOURNAL_LIMIT_BYTES}")  # a checkpoint cuts the WAL back to it
            cur.execute("PRAGMA busy_timeout=0")  # on the event loop: fail at once when locked
            cur.close()

        return engine
    if read_only:
        return create_async_engine(
            url,
            pool_size=1,
            max_overflow=0,  # its readers run one statement at a time
            # a second line only: the holder may turn it off; its login's grants are the boundary (roles.py)
            connect_args={"server_settings": {"default_transaction_read_only": "on"}},
        )
    return create_async_engine(url, pool_size=pool_size, max_overflow=0)


async def run_on(engine: Engine | AsyncEngine, work: Callable[[Connection], T], write: bool = False) -> T:
    """`work(connection)` in one transaction on either kind of engine, disposed after: for occasional jobs only."""
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
