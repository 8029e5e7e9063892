"""A database's schema against this code's revisions (Alembic): the check of every open, the reading, the upgrade."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from roundtrip._kernel.database import make_engine, run_on, shown
from roundtrip._kernel.migrations import CONVERSATIONS, LEDGER, UPGRADE, DatabaseUnreachable, SchemaMismatch

LOCK_KEY = 7_347_211_908  # any constant, the same in every process
SQLITE_LOCK_WAIT_MS = 60_000


class _DatabaseUrls(Protocol):
    @property
    def ledger_db_url(self) -> str: ...

    @property
    def conversations_db_url(self) -> str: ...


def databases(settings: _DatabaseUrls) -> dict[str, tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {}
    for url, store in ((settings.ledger_db_url, LEDGER), (settings.conversations_db_url, CONVERSATIONS)):
        found[url] = (*found.get(url, ()), store)
    return found


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    return config


@functools.cache
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head(store: str) -> str:
    return _scripts().get_revision(f"{store}@head").revision


@functools.cache
def lineage(store: str) -> frozenset[str]:
    return frozenset(s.revision for s in _scripts().iterate_revisions(f"{store}@head", "base"))


@functools.cache
def _known() -> frozenset[str]:
    return frozenset(s.revision for s in _scripts().walk_revisions())


def found_revision(conn: Connection, store: str) -> str | None:
    """The store's revision in the database, or None; one this code does not know (a newer roundtrip's) as it is."""
    current = MigrationContext.configure(conn).get_current_heads()
    mine = [r for r in current if r in lineage(store)]
    unknown = [r for r in current if r not in _known()]
    return next(iter(mine or unknown), None)


def mismatch(store: str, url: str, found: str | None) -> str | None:
    expected = head(store)
    if found == expected:
        return None
    where = f"the {store} database {shown(url)}"
    if found is None:
        return (
            f"{where} has no revision of the {store} tables (a new database, or one made before migrations); "
            f"this code needs {expected}: run `{UPGRADE}`"
        )
    if found in lineage(store):
        return f"{where} is at revision {found}, behind this code's {expected}: run `{UPGRADE}`"
    return (
        f"{where} is at revision {found}, which this code does not know (it needs {expected}): a newer roundtrip "
        "migrated it; run that version"
    )


def require(conn: Connection, store: str, url: str) -> None:
    why = mismatch(store, url, found_revision(conn, store))
    if why:
        raise SchemaMismatch(why)


@contextlib.contextmanager
def reaching(url: str) -> Iterator[None]:
    try:
        yield
    except (OSError, DBAPIError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise DatabaseUnreachable(f"cannot use the database {shown(url)}: {reason}") from exc


async def current(url: str, stores: Sequence[str]) -> dict[str, str | None]:
    with reaching(url):
        return await run_on(make_engine(url, read_only=True), lambda conn: {s: found_revision(conn, s) for s in stores})


async def upgrade(url: str, stores: Sequence[str]) -> list[tuple[str, str | None, str | None]]:
    """Apply the stores' missing revisions in one locked transaction; (store, before, after) for each. A store
    ahead of this code is refused before anything runs."""

    def work(conn: Connection) -> list[tuple[str, str | None, str | None]]:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})  # until this transaction ends
        before = {s: found_revision(conn, s) for s in stores}
        for store, found in before.items():
            if found is not None and found not in lineage(store):
                raise SchemaMismatch(mismatch(store, url, found))
        config = alembic_config()
        config.attributes["connection"] = conn  # env.py runs on it
        for store in stores:
            command.upgrade(config, f"{store}@head")
        return [(s, before[s], found_revision(conn, s)) for s in stores]

    engine = make_engine(url)
    if not isinstance(engine, AsyncEngine):
        _transactional_sqlite(engine)
    with reaching(url):
        return await run_on(engine, work, write=True)


def upgrade_databases(settings: _DatabaseUrls) -> list[str]:
    lines = []
    for url, stores in databases(settings).items():
        for store, before, after in asyncio.run(upgrade(url, stores)):
            change = f"at {after} already" if before == after else f"{before or 'no revision'} -> {after}"
            lines.append(f"{store} database {shown(url)}: {change}")
    return lines


def _transactional_sqlite(engine: Any) -> None:
    """BEGIN IMMEDIATE, so a second upgrade waits for the first and finds its work done, and the DDL inside the
    transaction (pysqlite would run it outside)."""

    @event.listens_for(engine, "connect")
    def _own_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy's BEGIN below, not pysqlite's own

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql(f"PRAGMA busy_timeout={SQLITE_LOCK_WAIT_MS}")
        conn.exec_driver_sql("BEGIN IMMEDIATE")
