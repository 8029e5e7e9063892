"""Migrations of the fleet's own tables, on both databases: an old database upgraded in place with its turns kept,
one made before migrations adopted, upgrades run at once, and the services and CLI commands that refuse a database
behind or ahead of the code (one line, exit code 1) and never write to it when they only read."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, Text, insert, inspect, select, text
from sqlalchemy.exc import DBAPIError

from roundtrip._broker.embedded import free_port
from roundtrip._guard.conversations import Conversations
from roundtrip._guard.ledger import Ledger
from roundtrip._kernel.database import make_engine, run_on
from roundtrip._kernel.migrations import CONVERSATIONS, LEDGER, STORES, SchemaMismatch
from roundtrip._kernel.migrations.schema import current, head, upgrade, upgrade_databases
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage import ledger_reads, turnstore
from roundtrip._kernel.storage.turnstore import Fence
from tests.databases import migrated_to

BEHIND = "ledger_0002"  # one migration behind this code's ledger_0003
UPGRADE_LINE = "run `roundtrip db upgrade`"


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    """A new, empty database of either kind."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    return request.getfixturevalue("postgres_database")


async def on(url: str, work, write: bool = False):
    return await run_on(make_engine(url), work, write=write)


def cli(tmp_path: Path, *args: str, ledger_url: str, **env: str) -> subprocess.CompletedProcess:
    """`roundtrip ARGS` as an operator runs it, on the given ledger database (the conversations in it too)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")}
    environment.update(
        ROUNDTRIP_STATE_DIR=str(tmp_path / "state"),
        ROUNDTRIP_LEDGER_DATABASE_URL=ledger_url,
        ROUNDTRIP_ENV="development",
        ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}",
        **env,
    )
    return subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if "error" in line.lower() or "Traceback" in line]


def schema_drift(conn) -> list:
    """What differs between the database and the tables the code declares (nothing, once migrated)."""
    return compare_metadata(MigrationContext.configure(conn), [turnstore.metadata, ledger_reads.conversation_metadata])


# The turn table as the first fleet created it at open (services/_guard/ledger.py of the foundation).
FIRST_FLEET = MetaData()
Table(
    "turns",
    FIRST_FLEET,
    Column("turn_id", String(64), primary_key=True),
    Column("request_id", String(200), nullable=False),
    Column("conversation_id", String(200), nullable=False),
    Column("customer_id", String(200), nullable=False, index=True),
    Column("status", String(16), nullable=False, index=True),
    Column("step", Integer, nullable=False, default=0),
    Column("started_at", Float, nullable=False),
    Column("last_progress_at", Float, nullable=False),
    Column("flagged_at", Float),
    Column("ended_at", Float),
    Column("outcome", String(40)),
    Column("input_tokens", Integer, nullable=False, default=0),
    Column("output_tokens", Integer, nullable=False, default=0),
    Column("cache_creation_input_tokens", Integer, nullable=False, default=0),
    Column("cache_read_input_tokens", Integer, nullable=False, default=0),
    Column("cost_usd", Float, nullable=False, default=0.0),
    Column("trace_id", String(32), nullable=False, default=""),
    Column("traceparent", String(64)),
    Column("turn_json", Text, nullable=False),
    Column("pending", Text),
)
OLD_TURNS = [
    {
        "turn_id": "turn_old_1",
        "request_id": "req_1",
        "conversation_id": "conv_1",
        "customer_id": "cus_1001",
        "status": "ended",
        "step": 3,
        "started_at": 1000.0,
        "last_progress_at": 1010.0,
        "ended_at": 1010.0,
        "outcome": "end_turn",
        "input_tokens": 120,
        "output_tokens": 30,
        "cost_usd": 0.0042,
        "trace_id": "ab" * 16,
        "turn_json": '{"turn_id": "turn_old_1"}',
        "pending": None,
    },
    {
        "turn_id": "turn_old_2",
        "request_id": "req_2",
        "conversation_id": "conv_2",
        "customer_id": "cus_1002",
        "status": "running",
        "step": 1,
        "started_at": 2000.0,
        "last_progress_at": 2001.0,
        "turn_json": '{"turn_id": "turn_old_2"}',
        "pending": '{"step": 1}',
    },
]


# -- upgrading ------------------------------------------------------------------------------------------


async def test_a_new_database_gets_exactly_the_tables_the_code_declares(url):
    changes = await upgrade(url, STORES)
    assert changes == [(LEDGER, None, head(LEDGER)), (CONVERSATIONS, None, head(CONVERSATIONS))]
    assert await on(url, schema_drift) == []
    assert await upgrade(url, STORES) == [
        (LEDGER, head(LEDGER), head(LEDGER)),
        (CONVERSATIONS, head(CONVERSATIONS), head(CONVERSATIONS)),
    ]


async def test_a_ledger_of_the_first_fleet_is_upgraded_in_place_with_its_turns_kept(url, tmp_path):
    """A database the first fleet made (a turn table without the fence's columns, no approvals, no alembic_version)."""

    def make_old(conn):
        FIRST_FLEET.create_all(conn)
        for row in OLD_TURNS:
            conn.execute(insert(FIRST_FLEET.tables["turns"]), row)

    await on(url, make_old, write=True)
    done = cli(tmp_path, "db", "upgrade", ledger_url=url)
    assert done.returncode == 0, done.stderr
    assert f"ledger database {url}: no revision -> {head(LEDGER)}" in done.stdout.splitlines()
    assert await on(url, schema_drift) == []

    kept = await on(url, lambda conn: {r["turn_id"]: dict(r) for r in conn.execute(select(turnstore.turns)).mappings()})
    assert [{k: kept[row["turn_id"]][k] for k in row} for row in OLD_TURNS] == OLD_TURNS
    ledger = await Ledger.open(url)  # the guard starts on it now
    fence = await Fence.open(url)
    try:
        old = await ledger.get("turn_old_2")
        assert (old.status, old.step, old.deadline_at, old.lease_until) == ("running", 1, None, None)
        assert await fence.claim_batch(old, 1, lease_s=30, now=time.time())  # the new columns work on the old rows
        assert (await ledger.get("turn_old_2")).lease_step == 1
        assert (await ledger.get("turn_old_1")).outcome == "end_turn"
    finally:
        await fence.close()
        await ledger.close()


async def test_a_database_made_before_migrations_is_adopted_with_its_rows(url):
    """The tables the code made before migrations (create_all at open: today's, but for the columns of the revisions
    after the adoption): stamped, the later revisions applied, nothing lost."""
    turn = {
        "turn_id": "turn_today",
        "request_id": "r",
        "conversation_id": "conv_today",
        "customer_id": "cus_1001",
        "status": "running",
        "step": 2,
        "started_at": 1.0,
        "last_progress_at": 2.0,
        "turn_json": "{}",
        "deadline_at": 99.0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cost_usd": 0.0,
        "trace_id": "",
    }

    def made_before(conn):
        turnstore.metadata.create_all(conn)
        ledger_reads.conversation_metadata.create_all(conn)
        conn.execute(text("ALTER TABLE turns DROP COLUMN agent_digest"))  # ledger_0003: after the adoption
        conn.execute(text("ALTER TABLE turns DROP COLUMN acted"))  # ledger_0004: likewise
        conn.execute(text("ALTER TABLE turns DROP COLUMN reply_sha256"))  # ledger_0006: likewise
        conn.execute(text("ALTER TABLE turns DROP COLUMN lane"))  # ledger_0008: likewise
        conn.execute(text("ALTER TABLE turns DROP COLUMN agent_version"))  # ledger_0009: likewise
        conn.execute(text("DROP TABLE agent_versions"))  # ledger_0009
        conn.execute(text("ALTER TABLE conversations DROP COLUMN agent_version"))  # conversations_0002
        conn.execute(insert(turnstore.turns), turn)  # the columns it names only
        conn.execute(
            insert(ledger_reads.conversations),
            {
                "conversation_id": "conv_today",
                "customer_id": "cus_1001",
                "created_at": 1.0,
                "updated_at": 2.0,
                "turns": 4,
                "dropped_turns": 1,
            },
        )

    await on(url, made_before, write=True)
    assert await current(url, STORES) == {LEDGER: None, CONVERSATIONS: None}
    await upgrade(url, STORES)
    assert await current(url, STORES) == {LEDGER: head(LEDGER), CONVERSATIONS: head(CONVERSATIONS)}
    assert await on(url, schema_drift) == []
    ledger = await Ledger.open(url)
    store = await Conversations.open(url)
    try:
        assert (await ledger.get("turn_today")).deadline_at == 99.0
        row = await store.get("conv_today")
        assert (row.customer_id, row.turns, row.dropped_turns) == ("cus_1001", 4, 1)
    finally:
        await store.close()
        await ledger.close()


async def test_upgrades_started_at_once_run_one_after_the_other(url, tmp_path):
    """Several pods' init containers: each upgrade takes the lock first, so one migrates and the others find it done."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")}
    env.update(ROUNDTRIP_STATE_DIR=str(tmp_path / "state"), ROUNDTRIP_LEDGER_DATABASE_URL=url)
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "roundtrip._cli.main", "db", "upgrade"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        for _ in range(3)
    ]
    outputs = [(run.communicate(timeout=120), run.returncode) for run in runs]
    assert [code for _, code in outputs] == [0, 0, 0], [err for (_, err), _ in outputs]
    lines = [line for (out, _), _ in outputs for line in out.splitlines()]
    assert sum(f"no revision -> {head(LEDGER)}" in line for line in lines) == 1, lines
    assert sum(f"at {head(LEDGER)} already" in line for line in lines) == 2, lines
    assert await on(url, schema_drift) == []


def test_the_ledger_and_the_conversations_in_databases_of_their_own(tmp_path):
    ledger_url, conversations_url = (
        f"sqlite+aiosqlite:///{tmp_path / name}" for name in ("ledger.db", "conversations.db")
    )
    settings = Settings(
        _env_file=None, state_dir=tmp_path, ledger_database_url=ledger_url, conversations_database_url=conversations_url
    )
    assert upgrade_databases(settings) == [
        f"ledger database {ledger_url}: no revision -> {head(LEDGER)}",
        f"conversations database {conversations_url}: no revision -> {head(CONVERSATIONS)}",
    ]
    tables = {
        u: set(asyncio.run(on(u, lambda conn: inspect(conn).get_table_names())))
        for u in (ledger_url, conversations_url)
    }
    assert tables == {
        ledger_url: {"alembic_version", "turns", "approvals", "model_batch_calls", "agent_versions"},
        conversations_url: {"alembic_version", "conversations", "conversation_turns"},
    }
    assert asyncio.run(current(ledger_url, (LEDGER,))) == {LEDGER: head(LEDGER)}
    assert asyncio.run(current(conversations_url, (CONVERSATIONS,))) == {CONVERSATIONS: head(CONVERSATIONS)}


# -- refusing a database behind or ahead ------------------------------------------------------------------


async def _ahead(url: str) -> None:
    await upgrade(url, STORES)
    await on(
        url,
        lambda conn: conn.execute(
            text(f"UPDATE alembic_version SET version_num = 'ledger_9999' WHERE version_num = '{head(LEDGER)}'")
        ),
        write=True,
    )


async def test_the_stores_refuse_a_database_behind_or_ahead_of_the_code(url):
    await migrated_to(url, BEHIND)
    for store in (Ledger, Fence):
        with pytest.raises(SchemaMismatch) as refused:
            await store.open(url)
        assert (
            str(refused.value)
            == f"the ledger database {url} is at revision {BEHIND}, behind this code's {head(LEDGER)}: {UPGRADE_LINE}"
        )
    with pytest.raises(
        SchemaMismatch, match=f"has no revision of the conversations tables .* needs {head(CONVERSATIONS)}: "
    ):
        await Conversations.open(url)

    await _ahead(url)
    with pytest.raises(SchemaMismatch) as refused:
        await Ledger.open(url)
    assert str(refused.value) == (
        f"the ledger database {url} is at revision ledger_9999, which this code does not know "
        f"(it needs {head(LEDGER)}): a newer roundtrip migrated it; run that version"
    )
    with pytest.raises(SchemaMismatch, match="ledger_9999, which this code does not know"):
        await upgrade(url, STORES)  # nothing is run on a database a newer roundtrip migrated
    assert (await current(url, STORES))[LEDGER] == "ledger_9999"
    store = await Conversations.open(url)  # the conversation store, at its own head, still opens
    await store.close()


@pytest.mark.parametrize(
    "service, url",
    [("guard", "sqlite"), ("guard", "postgresql"), ("model", "sqlite"), ("executor", "sqlite")],
    indirect=["url"],
)
async def test_a_service_started_one_migration_behind_refuses_with_one_line(service, url, tmp_path):
    await migrated_to(url, BEHIND)
    done = cli(tmp_path, "run", service, ledger_url=url)
    assert done.returncode == 1
    assert error_lines(done) == [
        f"error: the ledger database {url} is at revision {BEHIND}, behind this code's {head(LEDGER)}: {UPGRADE_LINE}"
    ], done.stderr
    assert (await current(url, STORES))[LEDGER] == BEHIND  # it refused: it did not migrate on its own


async def test_a_service_started_on_a_database_ahead_of_its_code_refuses_with_one_line(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await _ahead(url)
    done = cli(tmp_path, "run", "guard", ledger_url=url)
    assert done.returncode == 1
    assert error_lines(done) == [
        f"error: the ledger database {url} is at revision ledger_9999, which this code does not know "
        f"(it needs {head(LEDGER)}): a newer roundtrip migrated it; run that version"
    ], done.stderr


# -- the CLI's readings ------------------------------------------------------------------------------------


async def test_the_listing_commands_never_write(url, tmp_path):
    await upgrade(url, STORES)
    path = Path(url.split(":///", 1)[1]) if url.startswith("sqlite") else None
    before = hashlib.sha256(path.read_bytes()).hexdigest() if path else None
    for command in (["turns"], ["approvals", "--all"], ["conversations"], ["db", "current"]):
        done = cli(tmp_path, *command, ledger_url=url)
        assert done.returncode == 0 and not error_lines(done), (command, done.stdout, done.stderr)
    if path:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    # what they open cannot write, on either database
    ledger = await Ledger.open(url, read_only=True)
    try:
        with pytest.raises(DBAPIError, match=r"(?i)read.?only"):
            await ledger.start({"turn_id": "t", "request_id": "r", "conversation_id": "c", "customer_id": "cus"}, "{}")
    finally:
        await ledger.close()


async def test_a_listing_on_a_database_behind_refuses_and_leaves_it_as_it_is(url, tmp_path):
    await migrated_to(url, BEHIND)
    done = cli(tmp_path, "turns", ledger_url=url)
    assert done.returncode == 1
    assert error_lines(done) == [
        f"error: the ledger database {url} is at revision {BEHIND}, behind this code's {head(LEDGER)}: {UPGRADE_LINE}"
    ]
    done = cli(tmp_path, "db", "current", ledger_url=url)
    assert done.returncode == 1 and f"is at revision {BEHIND}, behind" in done.stdout
    assert await current(url, STORES) == {LEDGER: BEHIND, CONVERSATIONS: None}


def test_an_unreachable_database_is_one_line_without_its_password(tmp_path):
    url = f"postgresql+asyncpg://roundtrip:s3cret-pw@127.0.0.1:{free_port()}/ledger"
    for command in (["db", "upgrade"], ["db", "current"], ["run", "guard"]):
        done = cli(tmp_path, *command, ledger_url=url)
        assert done.returncode == 1, (command, done.stderr)
        (line,) = error_lines(done)
        assert line.startswith("error: cannot use the database postgresql+asyncpg://roundtrip:***@127.0.0.1:"), line
        assert "s3cret-pw" not in done.stdout + done.stderr
