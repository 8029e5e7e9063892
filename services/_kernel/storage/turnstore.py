"""The turn table the guard, the executor and the model service share, and the fence that guards side effects.

The executor and the model service claim (turn, step) with one conditional UPDATE right before they act; an end
from outside the loop lands only while no lease is live (docs/guarantees.md, "The turn fence"). A claim also
matches the turn's customer and conversation against the ledger's row: anything that can write an internal topic
can copy a live turn, so the ledger, not the event, says whose it is.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
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

from roundtrip._kernel.database import POOL_SIZE, T, make_engine
from roundtrip._kernel.migrations import LEDGER
from roundtrip._kernel.migrations.schema import reaching, require

log = logging.getLogger("roundtrip.fence")
security = logging.getLogger("roundtrip.security")
SQLITE_LOCK_WAIT_MS = 30_000
LOCKED_RETRY_S = (0.0005, 0.002)  # a locked file is tried again on the event loop before waiting in a thread

RUNNING, STUCK, ENDING, ENDED = "running", "stuck", "ending", "ended"
AWAITING = "awaiting"  # a person's decision: nothing may act, never flagged stuck
WAITING = "waiting"  # the API's rate limits: may act, never flagged stuck
LIVE = (RUNNING, STUCK, WAITING)
OPEN = (*LIVE, AWAITING)
INTERACTIVE, BATCH = "interactive", "batch"  # Turn.lane; a row without one predates the lane: interactive

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
    Column("deadline_at", Float),
    Column("lease_step", Integer),
    Column("lease_until", Float),
    Column("pending_at", Float),  # the outbox republishes old pending events
    Column("agent_digest", String(32)),
    Column("acted", Text),
    Column("reply_sha256", String(64)),  # the ended turn's reply text, recorded with its end (`reply_digest`)
    Column("lane", String(16)),
    Column("agent_version", String(40)),  # the agent version it runs on (None, "": the default version)
)
CONVERSATION_INDEX = Index("ix_turns_conversation_id", turns.c.conversation_id)
ENDED_AT_INDEX = Index("ix_turns_ended_at", turns.c.ended_at)  # retention deletes oldest first
# the share of new conversations each agent version takes (the ramp): the operator's, read by the guard
agent_versions = Table(
    "agent_versions",
    metadata,
    Column("version", String(40), primary_key=True),
    Column("share", Float, nullable=False),  # percent of new conversations
    Column("draining", Integer, nullable=False, default=0),
    Column("updated_at", Float, nullable=False),
)
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
    Column("status", String(16), nullable=False, index=True),
    Column("reason", Text, nullable=False),
    Column("requested_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("decided_by", String(200)),
    Column("decided_at", Float),
    Column("decision_reason", Text),
    Column("traceparent", String(64)),
    Column("request_json", Text, nullable=False),
)
# the calls of batch turns (services/_model/batch_store.py): the model service writes them, the console reads them
CALL_QUEUED, CALL_SUBMITTING, CALL_IN_BATCH = "queued", "submitting", "in_batch"
CALL_DONE, CALL_CANCELLED = "done", "cancelled"  # answered; its batch cancelled (every turn of its calls ended)
batch_calls = Table(
    "model_batch_calls",
    metadata,
    Column("turn_id", String(64), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("custom_id", String(64), nullable=False),
    Column("status", String(16), nullable=False, index=True),  # one of the CALL_ states above
    Column("grouping", String(64), nullable=False),  # calls of one batch share it (the simulator's persona)
    Column("queued_at", Float, nullable=False),
    Column("submission", String(40)),  # the submit that took it, recorded before the batch is created
    Column("submitted_at", Float),
    Column("batch_id", String(200), index=True),
    Column("lease_owner", String(200)),
    Column("lease_until", Float),
    Column("retried", Integer, nullable=False, default=0),
    Column("done_at", Float),
    Column("traceparent", String(64)),
    Column("command_json", Text),  # the CallModel, dropped once its answer is published
)


# Built once, so SQLAlchemy compiles each once. Bind names start with `b_`: a column's own name is its SET value.
IS_LIVE = or_(*(turns.c.status == status for status in LIVE))  # not IN: an IN list is rendered at every execution
BEFORE_DEADLINE = turns.c.deadline_at.is_(None) | (turns.c.deadline_at > bindparam("b_now"))
AT_STEP = (turns.c.turn_id == bindparam("b_turn_id")) & (turns.c.step == bindparam("b_step"))
OF_PRINCIPAL = (turns.c.customer_id == bindparam("b_customer_id")) & (
    turns.c.conversation_id == bindparam("b_conversation_id")
)
# a batch turn whose step no executor holds waits for its model call's Message Batch (the model service's claim
# releases the executor's lease): hours are normal there, so the stuck rule skips it and its deadline ends it;
# never NULL (a row without a lane is interactive), so its negation is sound
IN_BATCH = (func.coalesce(turns.c.lane, INTERACTIVE) == BATCH) & turns.c.lease_until.is_(None)
_CLAIM = update(turns).where(AT_STEP, OF_PRINCIPAL, IS_LIVE, BEFORE_DEADLINE)
_RELEASE_ENDING = update(turns).where(AT_STEP, OF_PRINCIPAL, turns.c.status == ENDING)
_WAITING = update(turns).where(AT_STEP, OF_PRINCIPAL, IS_LIVE)
_RECORDED = select(turns.c.customer_id, turns.c.conversation_id, turns.c.turn_json).where(
    turns.c.turn_id == bindparam("b_turn_id")
)
_ENDED_AS = select(
    turns.c.status,
    turns.c.customer_id,
    turns.c.conversation_id,
    turns.c.request_id,
    turns.c.outcome,
    turns.c.reply_sha256,
    turns.c.ended_at,
).where(turns.c.turn_id == bindparam("b_turn_id"))
_COUNT_WAITING = select(func.count()).select_from(turns).where(turns.c.status == WAITING)
_ENDED_AMONG = select(turns.c.turn_id).where(
    turns.c.turn_id.in_(bindparam("b_ids", expanding=True)), turns.c.status.in_((ENDING, ENDED))
)
_ACTED = update(turns).where(AT_STEP).values(acted=func.coalesce(turns.c.acted, "") + bindparam("b_lines"))


class Principal(Protocol):
    turn_id: str
    customer_id: str
    conversation_id: str


def principal(turn: Principal) -> dict[str, str]:
    return {"b_turn_id": turn.turn_id, "b_customer_id": turn.customer_id, "b_conversation_id": turn.conversation_id}


class TurnRefused(Exception):
    """An event whose turn names another customer or conversation than the ledger's: raised out of the handler,
    so the record is dead-lettered with the reason."""


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


NO_SUCH_TURN = "the ledger has no such turn"  # deleted by retention or never started: not itself a forgery


def disagreement(turn: Principal, recorded: Any) -> str | None:
    if recorded is None:
        return NO_SUCH_TURN
    if recorded.customer_id != turn.customer_id:
        return "its customer is not the one the turn was started for"
    if recorded.conversation_id != turn.conversation_id:
        return "its conversation is not the one the turn was started in"
    return None


def reply_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sqlite_locked(exc: OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


def no_live_lease(now: float) -> Any:
    return turns.c.lease_until.is_(None) | (turns.c.lease_until <= now)


class TurnStore:
    """On SQLite the statements run inline through one kept connection; each call is its own transaction, ended
    before `_run` returns, so a read never holds an old snapshot."""

    STORE = LEDGER

    def __init__(self, engine: Engine | AsyncEngine) -> None:
        self.engine = engine
        self._autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT") if isinstance(engine, AsyncEngine) else None
        )
        self._inline: Connection | None = None
        self._inline_auto: Connection | None = None

    @classmethod
    async def open(cls, url: str, read_only: bool = False, pool_size: int = POOL_SIZE) -> Self:
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
        """`single`: `work` is one statement, run in autocommit mode, so SQLite never holds the write lock between
        two calls from Python (docs/decisions/ledger-statements.md)."""
        if isinstance(self.engine, AsyncEngine):
            if single and self._autocommit is not None:
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
            except OperationalError as exc:
                if not sqlite_locked(exc):
                    raise
            if pause is None:
                break
            await asyncio.sleep(pause)
        return await asyncio.to_thread(self._run_waiting, work, write, single)

    def _connection(self, autocommit: bool = False) -> Connection:
        assert isinstance(self.engine, Engine)
        conn = self._inline_auto if autocommit else self._inline
        if conn is None or conn.closed or conn.invalidated:
            conn = self.engine.connect()
            if autocommit:
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                self._inline_auto = conn
            else:
                self._inline = conn
        return conn

    def _run_waiting(self, work: Callable[[Connection], T], write: bool, single: bool) -> T:
        assert isinstance(self.engine, Engine)
        with self.engine.begin() if write and not single else self.engine.connect() as conn:
            if single:
                conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql(f"PRAGMA busy_timeout={SQLITE_LOCK_WAIT_MS}")
            try:
                return work(conn)
            finally:
                conn.exec_driver_sql("PRAGMA busy_timeout=0")

    async def waiting_for_capacity(self) -> int:
        """Turns waiting for the API's rate limits now (the gateway's signal to admit fewer)."""
        return cast(int, await self._run(lambda conn: conn.execute(_COUNT_WAITING).scalar_one(), single=True))

    async def ended_among(self, turn_ids: list[str]) -> set[str]:
        if not turn_ids:
            return set()
        return await self._run(
            lambda conn: set(conn.execute(_ENDED_AMONG, {"b_ids": list(turn_ids)}).scalars()), single=True
        )

    async def recorded(self, turn_id: str) -> Any:
        return await self._run(lambda conn: conn.execute(_RECORDED, {"b_turn_id": turn_id}).first(), single=True)

    async def ended_as(self, turn_id: str) -> Any:
        """The end the guard recorded (status, principal, outcome, `reply_sha256`), or None: one read by key."""
        return await self._run(lambda conn: conn.execute(_ENDED_AS, {"b_turn_id": turn_id}).first(), single=True)

    async def refuse_if_not_recorded(self, turn: Principal, service: str) -> None:
        """Raise TurnRefused when `turn` is not the ledger's: after a refused claim, tells a forgery from an end."""
        why = disagreement(turn, await self.recorded(turn.turn_id))
        if why is not None and why != NO_SUCH_TURN:
            raise refused(turn, service, why)

    async def _update(self, statement: Any, params: dict[str, Any] | None = None) -> bool:
        return await self._run(lambda conn: conn.execute(statement, params).rowcount == 1, write=True, single=True)


class Fence(TurnStore):
    """What the executor and the model service ask right before they act. A claim refused because the turn names
    another principal raises TurnRefused; any other refusal returns False."""

    async def claim_batch(self, turn: Principal, step: int, lease_s: float, now: float) -> bool:
        """Lease (turn, step) for `lease_s` while the turn is live, at `step`, before its deadline. A redelivered
        batch of the same step may claim again: its calls are idempotent by tool_use_id."""
        claim = {**principal(turn), "b_step": step, "b_now": now, "lease_step": step, "lease_until": now + lease_s}
        if await self._update(_CLAIM, claim):
            return True
        await self.refuse_if_not_recorded(turn, "executor")
        return False

    async def claim_model_call(self, turn: Principal, step: int, now: float) -> bool:
        """True when the turn is live at `step` before its deadline; releases the step's executor lease."""
        if await self._update(_CLAIM, {**principal(turn), "b_step": step, "b_now": now, "lease_until": None}):
            return True
        await self.refuse_if_not_recorded(turn, "model")
        # an end waiting for this step's lease may go now
        await self._update(_RELEASE_ENDING, {**principal(turn), "b_step": step, "lease_until": None})
        return False

    async def wait_for_capacity(self, turn: Principal, step: int, now: float) -> bool:
        return await self._update(
            _WAITING,
            {**principal(turn), "b_step": step, "status": WAITING, "last_progress_at": now, "flagged_at": None},
        )

    async def record_acted(self, turn_id: str, step: int, lines: str) -> None:
        """Append this step's side effects whatever the turn's state now (they happened); under the step's lease,
        so an end from outside the loop reads them."""
        await self._update(_ACTED, {"b_turn_id": turn_id, "b_step": step, "b_lines": lines})
