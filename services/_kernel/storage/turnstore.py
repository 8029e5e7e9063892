"""The turn table every service that acts for a turn shares, and the fence that guards side effects.

The guard owns the turn's life (services/_guard/ledger.py: start, advance, end); the executor
and the model service only ask the fence, right before they act, whether the turn may still
act at this step. SQLite file by default, PostgreSQL by URL (services/_kernel/storage/database.py);
SQLAlchemy Core, the same statements on both. The tables are made by migrations
(services/_kernel/migrations, `roundtrip db upgrade`): a store's `open` only checks that they are
at this code's revision, and never runs DDL.

The fence (see the README, "When things go wrong"):
* `claim_batch` (executor, before running a step's calls): ONE conditional UPDATE that takes a
  short lease on (turn, step) only while the turn is live, at that step, and before its
  deadline. Rowcount 1: the calls may run. Rowcount 0: the turn has ended, been cancelled,
  moved on, or passed its deadline: nothing runs.
* `claim_model_call` (model service, before calling the model): ONE conditional UPDATE with the
  same conditions; it also releases the executor's lease of that step (its side effects are done).
* `wait_for_capacity` (model service, when a call must wait for the API's rate limits): the turn,
  live at that step, becomes WAITING: still live (the guard's next step makes it RUNNING), never
  flagged stuck, still ended at its deadline.
* `record_acted` (executor, after a step's calls ran): appends the side effects that succeeded
  (services/_kernel/storage/sideeffects.py), still under the lease, for the reply of an end from outside.
* Every claim also compares the turn's principal (its customer and conversation) with the row the guard
  recorded from the gateway's request: an event whose turn names another customer than the ledger's claims
  nothing, and the claimer raises `TurnRefused` (dead-lettered with the reason, logged on `roundtrip.security`).
  Anything that can write an internal topic can copy a live turn, so the ledger, not the event, says whose it is.
* Every end from outside the loop (cancel, deadline, stuck) is conditional on no live lease,
  so an end never lands while a claimed batch is running: either the claim wins (the side
  effect happens, and the end is recorded after it) or the end wins (the claim fails).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, Self, cast

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from roundtrip._kernel.migrations import LEDGER
from roundtrip._kernel.migrations.schema import reaching, require
from roundtrip._kernel.storage.database import POOL_SIZE, T, make_engine

log = logging.getLogger("roundtrip.fence")
security = logging.getLogger("roundtrip.security")
SQLITE_LOCK_WAIT_MS = 30_000  # how long a write that found the file locked waits for it, in a thread
LOCKED_RETRY_S = (0.0005, 0.002)  # before that: tried again on the event loop after these pauses (a lock lasts ~0.1 ms)

RUNNING, STUCK, ENDING, ENDED = "running", "stuck", "ending", "ended"
AWAITING = "awaiting"  # a call waits for a person's decision: nothing may act, the stuck rule does not apply
# its model call waits for the API's capacity (rate limits): it may act, the stuck rule does not apply
WAITING = "waiting"
LIVE = (RUNNING, STUCK, WAITING)  # may still act: claims succeed only in these states
OPEN = (*LIVE, AWAITING)  # not ended: an end from outside (cancel, deadline) may still end these

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
    # -- added by the fence and the outbox (migration ledger_0002) --
    Column("deadline_at", Float),  # the turn may not act after this (Unix time)
    Column("lease_step", Integer),  # the step an executor claimed ...
    Column("lease_until", Float),  # ... and until when its calls may still be running
    Column("pending_at", Float),  # when `pending` was written (the outbox republishes old ones)
    # -- migration ledger_0003 --
    Column("agent_digest", String(32)),  # Agent.digest of the guard that started the turn (its prompt and tools)
    # -- migration ledger_0004 --
    Column("acted", Text),  # the side effects the turn has had: JSON lines the executor appends (kernel/sideeffects.py)
)
CONVERSATION_INDEX = Index("ix_turns_conversation_id", turns.c.conversation_id)  # the guard: is a turn of it running?
ENDED_AT_INDEX = Index("ix_turns_ended_at", turns.c.ended_at)  # migration ledger_0005: retention deletes oldest first
# One row per call held for a person's approval (the guard writes it; `roundtrip approvals` reads it).
approvals = Table(
    "approvals",
    metadata,
    Column("approval_id", String(64), primary_key=True),
    Column("turn_id", String(64), nullable=False, index=True),
    Column("step", Integer, nullable=False),
    Column("tool_use_id", String(200), nullable=False),
    Column("tool", String(64), nullable=False),
    Column("input_sha256", String(64), nullable=False),
    Column("customer_id", String(200), nullable=False),
    Column("conversation_id", String(200), nullable=False),
    Column("status", String(16), nullable=False, index=True),  # pending, approved, denied, expired, ended
    Column("reason", Text, nullable=False),
    Column("requested_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("decided_by", String(200)),
    Column("decided_at", Float),
    Column("decision_reason", Text),
    Column("traceparent", String(64)),
    Column("request_json", Text, nullable=False),
)


# The statements of the hot path (every step of every turn) are built once, with bind parameters:
# SQLAlchemy then compiles each once and only binds values; building a statement per call (and an
# IN list, rendered at every execution) cost several times what the statement itself costs on SQLite
# (docs/decisions/ledger-statements.md). Bind names start with `b_`: a column's own name is its value in the SET.
IS_LIVE = or_(*(turns.c.status == status for status in LIVE))  # = status IN LIVE, compiled once
BEFORE_DEADLINE = turns.c.deadline_at.is_(None) | (turns.c.deadline_at > bindparam("b_now"))
AT_STEP = (turns.c.turn_id == bindparam("b_turn_id")) & (turns.c.step == bindparam("b_step"))
# the turn is the one the ledger recorded for this customer and conversation (see `principal`)
OF_PRINCIPAL = (turns.c.customer_id == bindparam("b_customer_id")) & (
    turns.c.conversation_id == bindparam("b_conversation_id")
)
_CLAIM = update(turns).where(AT_STEP, OF_PRINCIPAL, IS_LIVE, BEFORE_DEADLINE)
_RELEASE_ENDING = update(turns).where(AT_STEP, OF_PRINCIPAL, turns.c.status == ENDING)
_WAITING = update(turns).where(AT_STEP, OF_PRINCIPAL, IS_LIVE)
_RECORDED = select(turns.c.customer_id, turns.c.conversation_id, turns.c.turn_json).where(
    turns.c.turn_id == bindparam("b_turn_id")
)
_COUNT_WAITING = select(func.count()).select_from(turns).where(turns.c.status == WAITING)
_ENDED_AMONG = select(turns.c.turn_id).where(
    turns.c.turn_id.in_(bindparam("b_ids", expanding=True)), turns.c.status.in_((ENDING, ENDED))
)
_ACTED = update(turns).where(AT_STEP).values(acted=func.coalesce(turns.c.acted, "") + bindparam("b_lines"))


class Principal(Protocol):
    """What names a turn and whose it is: the wire's `Turn` (events.py) has these and more."""

    turn_id: str
    customer_id: str
    conversation_id: str


def principal(turn: Principal) -> dict[str, str]:
    """The bind parameters of `AT_STEP`'s turn and `OF_PRINCIPAL`."""
    return {"b_turn_id": turn.turn_id, "b_customer_id": turn.customer_id, "b_conversation_id": turn.conversation_id}


class TurnRefused(Exception):
    """An event whose turn is not the ledger's (another customer or conversation than the one recorded at its
    start): it must not act. Raised out of the handler, so the record is dead-lettered with this reason."""


def refused(turn: Principal, service: str, why: str) -> TurnRefused:
    """The refusal of `turn`'s event, logged on `roundtrip.security` (ids with %r: they came off a topic)."""
    security.error(
        "%s refused an event for turn %r (customer %r, conversation %r): %s",
        service,
        turn.turn_id,
        turn.customer_id,
        turn.conversation_id,
        why,
    )
    return TurnRefused(f"turn {turn.turn_id!r} refused: {why}")


NO_SUCH_TURN = "the ledger has no such turn"  # a turn deleted by retention, or never started: not itself a forgery


def disagreement(turn: Principal, recorded: Any) -> str | None:
    """Why `turn` is not the one the ledger recorded (`recorded`: its row's customer_id and conversation_id, or None
    when the ledger has no such turn); None when it is."""
    if recorded is None:
        return NO_SUCH_TURN
    if recorded.customer_id != turn.customer_id:
        return "its customer is not the one the turn was started for"
    if recorded.conversation_id != turn.conversation_id:
        return "its conversation is not the one the turn was started in"
    return None


def sqlite_locked(exc: OperationalError) -> bool:
    """SQLite's answer when another connection holds the lock the statement needs (busy_timeout ran out)."""
    return "locked" in str(exc) or "busy" in str(exc)


def no_live_lease(now: float) -> Any:
    """SQL condition: no executor holds a lease on the turn at `now`."""
    return turns.c.lease_until.is_(None) | (turns.c.lease_until <= now)


class TurnStore:
    """An engine on the turn table; `open` checks that the database is at this code's revision of the store.

    On SQLite the statements run inline on the event loop through one connection the store keeps open
    (checking a pooled connection out and back in, with its reset, cost about as much as the statement;
    docs/decisions/ledger-statements.md); every call is its own transaction, begun and ended before `_run` returns, so a
    read never holds on to an old snapshot."""

    STORE = LEDGER  # the line of migrations of its tables (services/_kernel/migrations)

    def __init__(self, engine: Engine | AsyncEngine) -> None:
        self.engine = engine
        # PostgreSQL: the same pool, its connections in autocommit mode while checked out (single statements)
        self._autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT") if isinstance(engine, AsyncEngine) else None
        )
        self._inline: Connection | None = None  # SQLite: the event loop's own connection ...
        self._inline_auto: Connection | None = None  # ... and one in autocommit mode, for single statements

    @classmethod
    async def open(cls, url: str, read_only: bool = False, pool_size: int = POOL_SIZE) -> Self:
        """The store on `url` (`read_only`: one that cannot write, for the CLI's listings; `pool_size`: its PostgreSQL
        connections, `ROUNDTRIP_DATABASE_POOL_SIZE`).
        Raises SchemaMismatch when its tables are not at this code's revision (`roundtrip db upgrade`),
        DatabaseUnreachable when it cannot reach the database."""
        store = cls(make_engine(url, read_only=read_only, pool_size=pool_size))
        try:
            with reaching(url):
                await store._run(lambda conn: require(conn, cls.STORE, url))
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        for conn in (self._inline, self._inline_auto):
            if conn is not None:
                conn.close()
        self._inline = self._inline_auto = None
        if isinstance(self.engine, AsyncEngine):
            await self.engine.dispose()
        else:
            self.engine.dispose()

    async def _run(self, work: Callable[[Connection], T], write: bool = False, single: bool = False) -> T:
        """Run `work(connection)` in a transaction (write) or a plain connection, on either engine.

        `single`: `work` is one statement, so it runs in autocommit mode. On SQLite, SQLite commits
        it inside the statement itself, without BEGIN and COMMIT round trips, and the write lock is
        never held between two calls from Python (in a thread that waits for the GIL, that gap
        held the lock across a GIL hand-off and made the other processes' writes find it locked).
        On PostgreSQL the server commits it as it runs: one round trip instead of three (BEGIN, the
        statement, COMMIT), on every step's claims and advance (docs/decisions/ledger-statements.md)."""
        if isinstance(self.engine, AsyncEngine):
            if single and self._autocommit is not None:  # one statement: autocommit, one round trip, not three
                async with self._autocommit.connect() as conn:
                    return await conn.run_sync(work)
            async with self.engine.begin() if write else self.engine.connect() as conn:
                return await conn.run_sync(work)
        for pause in (*LOCKED_RETRY_S, None):
            try:
                if single:
                    return work(self._connection(autocommit=True))
                inline = self._connection()
                with inline.begin():
                    return work(inline)
            except OperationalError as exc:  # another process holds the write lock: usually for microseconds
                if not sqlite_locked(exc):
                    raise
            if pause is None:
                break
            await asyncio.sleep(pause)
        return await asyncio.to_thread(
            self._run_waiting, work, write, single
        )  # held longer: wait for it off the event loop

    def _connection(self, autocommit: bool = False) -> Connection:
        """The event loop's own connection (one transactional, one in autocommit mode), opened once."""
        assert isinstance(self.engine, Engine)  # the inline connections are SQLite's, on the sync engine
        conn = self._inline_auto if autocommit else self._inline
        if conn is None or conn.closed or conn.invalidated:
            conn = self.engine.connect()
            if autocommit:
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                self._inline_auto = conn
            else:
                self._inline = conn
        return conn

    def _run_waiting(self, work: Callable[[Connection], T], write: bool, single: bool = False) -> T:
        assert isinstance(self.engine, Engine)  # SQLite's, on the sync engine
        with self.engine.begin() if write and not single else self.engine.connect() as conn:
            if single:
                conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql(f"PRAGMA busy_timeout={SQLITE_LOCK_WAIT_MS}")
            try:
                return work(conn)
            finally:
                conn.exec_driver_sql("PRAGMA busy_timeout=0")

    async def waiting_for_capacity(self) -> int:
        """Turns whose model call waits for the API's rate limits now (the gateway's signal to admit fewer)."""
        return cast(int, await self._run(lambda conn: conn.execute(_COUNT_WAITING).scalar_one(), single=True))

    async def ended_among(self, turn_ids: list[str]) -> set[str]:
        """Those of `turn_ids` whose turn has ended (or is ending): a gateway replica's running turns whose outcome
        another replica read."""
        if not turn_ids:
            return set()
        return await self._run(
            lambda conn: set(conn.execute(_ENDED_AMONG, {"b_ids": list(turn_ids)}).scalars()), single=True
        )

    async def recorded(self, turn_id: str) -> Any:
        """The turn's principal and its turn as the guard recorded it at the start (customer_id, conversation_id,
        turn_json), or None when the ledger has no such turn."""
        return await self._run(lambda conn: conn.execute(_RECORDED, {"b_turn_id": turn_id}).first(), single=True)

    async def refuse_if_not_recorded(self, turn: Principal, service: str) -> None:
        """Raise TurnRefused (logged on roundtrip.security) when `turn` is not the ledger's: the rare path after a
        refused claim, which tells a forged turn from one that has ended or moved on."""
        why = disagreement(turn, await self.recorded(turn.turn_id))
        if why is not None and why != NO_SUCH_TURN:
            raise refused(turn, service, why)

    async def _update(self, statement: Any, params: dict[str, Any] | None = None) -> bool:
        """A conditional update; True when it changed the one row (the caller owns the transition)."""
        return await self._run(lambda conn: conn.execute(statement, params).rowcount == 1, write=True, single=True)


class Fence(TurnStore):
    """What the executor and the model service ask right before they act for a turn.

    Each claim takes the event's `turn` and succeeds only for the ledger's own principal of it; a claim refused
    because the turn names another customer or conversation raises TurnRefused (one read, on the refused path
    only), any other refusal returns False."""

    async def claim_batch(self, turn: Principal, step: int, lease_s: float, now: float | None = None) -> bool:
        """Take a lease on (turn, step) for `lease_s`, only while the turn is live, at `step`, before its deadline.

        A redelivered batch of the same step may claim again (its calls are idempotent by
        tool_use_id); a batch of a step the turn has left, or of a turn that ended, cannot."""
        now = now or time.time()
        claim = {**principal(turn), "b_step": step, "b_now": now, "lease_step": step, "lease_until": now + lease_s}
        if await self._update(_CLAIM, claim):
            return True
        await self.refuse_if_not_recorded(turn, "executor")
        return False

    async def claim_model_call(self, turn: Principal, step: int, now: float | None = None) -> bool:
        """True when the turn is live at `step` before its deadline (and the step's executor lease is released)."""
        now = now or time.time()
        if await self._update(_CLAIM, {**principal(turn), "b_step": step, "b_now": now, "lease_until": None}):
            return True
        await self.refuse_if_not_recorded(turn, "model")
        # Refused (the rare path): if an end is waiting for this step's lease, let it go now.
        await self._update(_RELEASE_ENDING, {**principal(turn), "b_step": step, "lease_until": None})
        return False

    async def wait_for_capacity(self, turn: Principal, step: int, now: float | None = None) -> bool:
        """The turn's call at `step` waits for the API's capacity: WAITING (not stuck, however long, up to its
        deadline). False when the turn may not act any more (ended, cancelled, moved on)."""
        now = now or time.time()
        return await self._update(
            _WAITING,
            {**principal(turn), "b_step": step, "status": WAITING, "last_progress_at": now, "flagged_at": None},
        )

    async def record_acted(self, turn_id: str, step: int, lines: str) -> None:
        """Append the side effects this step had (services/_kernel/storage/sideeffects.py), whatever the turn's state
        now: they happened. Under the step's lease, so an end from outside the loop reads them."""
        await self._update(_ACTED, {"b_turn_id": turn_id, "b_step": step, "b_lines": lines})
