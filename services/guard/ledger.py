"""The turn ledger: one row per turn with its status, step, progress, usage, cost and outcome.

SQLite file by default, PostgreSQL by URL (SQLAlchemy Core: the same statements on both,
run inline on SQLite and through asyncpg on PostgreSQL). Every change
is a conditional UPDATE, so a redelivered event or a second guard replica cannot move
a turn twice: the caller that gets rowcount 1 owns the transition. `pending` holds the
message a transition decided to publish until it is published (a tiny outbox): a crash
between the two republishes it on redelivery instead of losing it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Connection, Engine, Float, Integer, MetaData, String, Table, Text, create_engine, event, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

RUNNING, STUCK, ENDED = "running", "stuck", "ended"
LIVE = (RUNNING, STUCK)

metadata = MetaData()
turns = Table(
    "turns",
    metadata,
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


@dataclass
class TurnRow:
    turn_id: str
    request_id: str
    conversation_id: str
    customer_id: str
    status: str
    step: int
    started_at: float
    last_progress_at: float
    flagged_at: float | None
    ended_at: float | None
    outcome: str | None
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cost_usd: float
    trace_id: str
    traceparent: str | None
    turn_json: str
    pending: str | None

    @property
    def turn(self) -> dict[str, Any]:
        return json.loads(self.turn_json)


def make_engine(url: str) -> Engine | AsyncEngine:
    """SQLite: a plain engine, used inline on the event loop (a WAL commit without fsync takes
    microseconds; a thread hop per statement costs more than the statement). PostgreSQL: asyncpg."""
    if url.startswith("sqlite"):
        path = url.split(":///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url.replace("+aiosqlite", ""), connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(conn, _record):  # WAL: readers (roundtrip turns) never block the guard
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    return create_async_engine(url, pool_size=5, max_overflow=5)


class Ledger:
    def __init__(self, engine: Engine | AsyncEngine) -> None:
        self.engine = engine

    @classmethod
    async def open(cls, url: str) -> Ledger:
        ledger = cls(make_engine(url))
        await ledger._run(metadata.create_all, write=True)
        return ledger

    async def close(self) -> None:
        result = self.engine.dispose()
        if isinstance(self.engine, AsyncEngine):
            await result

    async def _run(self, work: Callable[[Connection], Any], write: bool = False) -> Any:
        """Run `work(connection)` in a transaction (write) or a plain connection, on either engine."""
        if isinstance(self.engine, AsyncEngine):
            async with (self.engine.begin() if write else self.engine.connect()) as conn:
                return await conn.run_sync(work)
        with (self.engine.begin() if write else self.engine.connect()) as conn:
            return work(conn)

    async def _update(self, statement: Any) -> bool:
        """A conditional update; True when it changed the one row (the caller owns the transition)."""
        return await self._run(lambda conn: conn.execute(statement).rowcount == 1, write=True)

    async def _rows(self, statement: Any) -> list[TurnRow]:
        return await self._run(lambda conn: [TurnRow(**r) for r in conn.execute(statement).mappings().all()])

    # -- transitions --------------------------------------------------------------------
    async def start(self, turn: dict[str, Any], pending: str, traceparent: str | None = None, now: float | None = None) -> bool:
        """Register a new turn; False when it exists already (a duplicated request)."""
        now = now or time.time()
        statement = insert(turns).values(
            turn_id=turn["turn_id"], request_id=turn["request_id"], conversation_id=turn["conversation_id"],
            customer_id=turn["customer_id"], status=RUNNING, step=0, started_at=now, last_progress_at=now,
            trace_id=turn.get("trace_id", ""), traceparent=traceparent, turn_json=json.dumps(turn), pending=pending,
            input_tokens=0, output_tokens=0, cache_creation_input_tokens=0, cache_read_input_tokens=0, cost_usd=0.0,
        )
        try:
            await self._run(lambda conn: conn.execute(statement), write=True)
            return True
        except IntegrityError:
            return False

    async def advance(self, turn_id: str, step: int, usage: dict[str, int], cost_usd: float, pending: str,
                      outcome: str | None = None, traceparent: str | None = None, now: float | None = None) -> bool:
        """Record iteration `step` (and the end, with an outcome). Only from step-1 and a live turn."""
        now = now or time.time()
        values: dict[str, Any] = dict(step=step, last_progress_at=now, flagged_at=None, cost_usd=cost_usd, pending=pending,
                                      status=ENDED if outcome else RUNNING, traceparent=traceparent, **usage)
        if outcome:
            values.update(outcome=outcome, ended_at=now)
        return await self._update(
            update(turns).where(turns.c.turn_id == turn_id, turns.c.step == step - 1, turns.c.status.in_(LIVE)).values(**values)
        )

    async def end(self, turn_id: str, outcome: str, pending: str, now: float | None = None) -> bool:
        """End a live turn from outside the loop (stuck, deadline, cancel)."""
        now = now or time.time()
        return await self._update(
            update(turns).where(turns.c.turn_id == turn_id, turns.c.status.in_(LIVE))
            .values(status=ENDED, outcome=outcome, ended_at=now, pending=pending)
        )

    async def flag_stuck(self, turn_id: str, now: float | None = None) -> bool:
        now = now or time.time()
        return await self._update(
            update(turns).where(turns.c.turn_id == turn_id, turns.c.status == RUNNING).values(status=STUCK, flagged_at=now)
        )

    async def published(self, turn_id: str, step: int) -> None:
        """The decision taken at `step` is out; a later step's pending message is left alone."""
        await self._update(update(turns).where(turns.c.turn_id == turn_id, turns.c.step == step).values(pending=None))

    # -- reads ----------------------------------------------------------------------------
    async def get(self, turn_id: str) -> TurnRow | None:
        rows = await self._rows(select(turns).where(turns.c.turn_id == turn_id))
        return rows[0] if rows else None

    async def list(self, status: str | None = None, customer_id: str | None = None, limit: int = 50) -> list[TurnRow]:
        query = select(turns).order_by(turns.c.started_at.desc()).limit(limit)
        if status:
            query = query.where(turns.c.status == status)
        if customer_id:
            query = query.where(turns.c.customer_id == customer_id)
        return await self._rows(query)

    async def overdue(self, now: float, stuck_after_s: float, grace_s: float, deadline_s: float) -> tuple[list[TurnRow], list[TurnRow]]:
        """(running turns idle past stuck_after_s, live turns past their grace or the turn deadline)."""
        idle = await self._rows(select(turns).where(turns.c.status == RUNNING, turns.c.last_progress_at < now - stuck_after_s))
        expired = await self._rows(
            select(turns).where(
                turns.c.status.in_(LIVE),
                ((turns.c.status == STUCK) & (turns.c.flagged_at < now - grace_s)) | (turns.c.started_at < now - deadline_s),
            )
        )
        return idle, expired
