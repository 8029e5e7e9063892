"""The ledger's read side, beside its schema: a turn, the turns, their approvals, the ledger's size, the agent versions
side by side, the conversations and a stored turn's exchange, as rows. The guard writes these tables (its `Ledger`
and `Conversations` extend these reads); the console and the CLI read them here, without the guard.
"""

from __future__ import annotations

import builtins  # TurnReads.list shadows the builtin in the annotations that follow it
import json
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Column, Float, Index, Integer, MetaData, String, Table, Text, bindparam, func, or_, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from roundtrip._kernel.migrations import CONVERSATIONS
from roundtrip._kernel.storage.turnstore import (
    AWAITING,
    BATCH,
    CALL_IN_BATCH,
    CALL_QUEUED,
    CALL_SUBMITTING,
    INTERACTIVE,
    RUNNING,
    STUCK,
    TurnStore,
    approvals,
    batch_calls,
    turns,
)
from roundtrip._kernel.storage.versions import VersionRow, of_version, shown, summary_of

PENDING = "pending"

conversation_metadata = MetaData()
conversations = Table(
    "conversations",
    conversation_metadata,
    Column("conversation_id", String(200), primary_key=True),
    Column("customer_id", String(200), nullable=False, index=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False, index=True),
    Column("turns", Integer, nullable=False, default=0),
    Column("dropped_turns", Integer, nullable=False, default=0),
    Column("agent_version", String(40)),  # assigned at its first turn, kept by the later ones
)
exchanges = Table(
    "conversation_turns",
    conversation_metadata,
    Column("turn_id", String(64), primary_key=True),
    Column("conversation_id", String(200), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float),  # None while the turn runs: not history yet
    Column("text", Text, nullable=False),
    Column("messages", Text),
    Column("tokens", Integer, nullable=False, default=0),
    Column("outcome", String(40)),
    Index("ix_conversation_turns_conversation", "conversation_id", "started_at"),
)

_GET = select(turns).where(turns.c.turn_id == bindparam("b_turn_id"))
_OLDEST = select(func.min(turns.c.ended_at))
_COUNT = select(func.count()).select_from(turns)
_ESTIMATE = text("SELECT reltuples::bigint FROM pg_class WHERE relname = 'turns'")
_WAITING = select(func.count(), func.min(approvals.c.requested_at)).where(approvals.c.status == PENDING)
_call = batch_calls.c
_CALLS_WAITING = select(_call.turn_id, _call.step, _call.status, _call.batch_id).where(
    _call.turn_id.in_(bindparam("b_ids", expanding=True)),
    or_(*(_call.status == status for status in (CALL_QUEUED, CALL_SUBMITTING, CALL_IN_BATCH))),
)
IDS_A_QUESTION = 500


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
    deadline_at: float | None = None
    lease_step: int | None = None
    lease_until: float | None = None
    pending_at: float | None = None
    agent_digest: str | None = None
    acted: str | None = None  # the side effects the turn has had (services/_kernel/storage/sideeffects.py)
    reply_sha256: str | None = None
    lane: str | None = None
    agent_version: str | None = None
    batch_call: str | None = None  # not a column: its waiting call's state in model_batch_calls (with_batches)
    batch_id: str | None = None  # and the batch it waits in

    @property
    def turn(self) -> dict[str, Any]:
        return cast("dict[str, Any]", json.loads(self.turn_json))

    @property
    def in_batch(self) -> bool:
        """Its model call waits in a Message Batch (turnstore.IN_BATCH, read from the row)."""
        return self.lane == BATCH and self.status in (RUNNING, STUCK) and self.lease_until is None

    @property
    def shown_status(self) -> str:
        """The status as an operator reads it: `in batch msgbatch_...` for a turn whose call waits in that batch,
        `waiting for a batch` while it is gathered for one (`TurnReads.with_batches` says which)."""
        if not self.in_batch:
            return self.status
        if self.batch_id:
            return f"in batch {self.batch_id}"
        return "waiting for a batch" if self.batch_call in (CALL_QUEUED, CALL_SUBMITTING) else "in batch"

    @property
    def shown_lane(self) -> str:
        return self.lane or INTERACTIVE

    @property
    def shown_version(self) -> str:
        return shown(self.agent_version)


@dataclass
class ApprovalRow:
    approval_id: str
    turn_id: str
    step: int
    tool_use_id: str
    tool: str
    input_sha256: str
    customer_id: str
    conversation_id: str
    status: str
    reason: str
    requested_at: float
    expires_at: float
    decided_by: str | None
    decided_at: float | None
    decision_reason: str | None
    traceparent: str | None
    request_json: str


@dataclass
class ConversationRow:
    conversation_id: str
    customer_id: str
    created_at: float
    updated_at: float
    turns: int
    dropped_turns: int
    history_turns: int = 0
    history_tokens: int = 0
    agent_version: str | None = None


@dataclass
class LedgerSize:
    rows: int  # PostgreSQL: the planner's estimate; SQLite: counted
    oldest_ended_at: float | None
    estimated: bool = False

    def line(self, retention_s: float, now: float) -> str:
        oldest = (
            f"oldest ended turn {duration(now - self.oldest_ended_at)} ago"
            if self.oldest_ended_at is not None
            else "no ended turn"
        )
        rows = f"~{self.rows}" if self.estimated else str(self.rows)
        return f"ledger: {rows} turns, {oldest} (ended turns are kept {duration(retention_s)})"


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}".replace(".0 ", " ")
    return f"{seconds:.0f} s"


class TurnReads(TurnStore):
    """The turn ledger's turns and approvals, read."""

    async def _rows(self, statement: Any, params: dict[str, Any] | None = None) -> builtins.list[TurnRow]:
        return await self._run(
            lambda conn: [TurnRow(**r) for r in conn.execute(statement, params).mappings().all()], single=True
        )

    async def _approval_rows(self, statement: Any) -> builtins.list[ApprovalRow]:
        return await self._run(lambda conn: [ApprovalRow(**r) for r in conn.execute(statement).mappings().all()])

    async def get(self, turn_id: str) -> TurnRow | None:
        rows = await self._rows(_GET, {"b_turn_id": turn_id})
        return rows[0] if rows else None

    async def list(
        self,
        status: str | None = None,
        customer_id: str | None = None,
        limit: int = 50,
        conversation_id: str | None = None,
        outcome: str | None = None,
        since: float | None = None,
        lane: str | None = None,
        version: str | None = None,
    ) -> builtins.list[TurnRow]:
        """The newest turns first; `version` "": the default version's."""
        query = select(turns).order_by(turns.c.started_at.desc()).limit(limit)
        if lane == BATCH:
            query = query.where(turns.c.lane == BATCH)
        elif lane == INTERACTIVE:
            query = query.where(turns.c.lane.is_(None) | (turns.c.lane != BATCH))
        for column, value in (
            (turns.c.status, status),
            (turns.c.customer_id, customer_id),
            (turns.c.conversation_id, conversation_id),
            (turns.c.outcome, outcome),
        ):
            if value:
                query = query.where(column == value)
        if since:
            query = query.where(turns.c.started_at >= since)
        if version is not None:
            query = query.where(of_version(version))
        return await self.with_batches(await self._rows(query))

    async def with_batches(self, rows: builtins.list[TurnRow]) -> builtins.list[TurnRow]:
        """`rows`, each batch turn whose call is with the model service told the state of that call and its batch."""
        waiting = {row.turn_id: row for row in rows if row.in_batch}
        ids = [*waiting]
        for start in range(0, len(ids), IDS_A_QUESTION):
            found = await self._calls_waiting(ids[start : start + IDS_A_QUESTION])
            for turn_id, _, status, batch_id in sorted(found, key=lambda call: call.step):  # its latest call last
                waiting[turn_id].batch_call, waiting[turn_id].batch_id = status, batch_id
        return rows

    async def _calls_waiting(self, turn_ids: builtins.list[str]) -> builtins.list[Any]:
        return await self._run(lambda conn: list(conn.execute(_CALLS_WAITING, {"b_ids": turn_ids})), single=True)

    async def approval(self, approval_id: str) -> ApprovalRow | None:
        rows = await self._approval_rows(select(approvals).where(approvals.c.approval_id == approval_id))
        return rows[0] if rows else None

    async def list_approvals(
        self, status: str | None, turn_id: str | None = None, *, limit: int
    ) -> builtins.list[ApprovalRow]:
        """Approvals, newest first; pending ones only while their turn still waits."""
        query = select(approvals).order_by(approvals.c.requested_at.desc()).limit(limit)
        if status:
            query = query.where(approvals.c.status == status)
        if status == PENDING:
            query = query.where(approvals.c.turn_id.in_(select(turns.c.turn_id).where(turns.c.status == AWAITING)))
        if turn_id:
            query = query.where(approvals.c.turn_id == turn_id)
        return await self._approval_rows(query)

    async def size(self) -> LedgerSize:
        """The ledger's rows and its oldest ended turn (on PostgreSQL an estimate: counting millions is a load)."""
        postgres = isinstance(self.engine, AsyncEngine)

        def read(conn: Any) -> LedgerSize:
            oldest = conn.execute(_OLDEST).scalar_one()
            if postgres and (estimate := conn.execute(_ESTIMATE).scalar()) is not None and estimate >= 0:
                return LedgerSize(int(estimate), oldest, estimated=True)
            return LedgerSize(int(conn.execute(_COUNT).scalar_one()), oldest)

        return await self._run(read)

    async def approvals_waiting(self) -> tuple[int, float | None]:
        """How many approvals wait for a person's decision, and when the oldest of them was asked (None: none)."""
        count, oldest = await self._run(lambda conn: conn.execute(_WAITING).one())
        return int(count), oldest

    async def versions(self) -> builtins.list[VersionRow]:
        """The agent versions side by side, as `roundtrip versions` shows them (storage/versions.py)."""
        return await self._run(summary_of)


class ConversationReads(TurnStore):
    """The conversation store's conversations and stored exchanges, read."""

    STORE = CONVERSATIONS

    async def exchange(self, turn_id: str) -> builtins.list[dict[str, Any]] | None:
        """One stored turn as history, or None when it is not stored (running, forgotten, dropped)."""
        rows = await self._run(
            lambda conn: conn.execute(select(exchanges.c.messages).where(exchanges.c.turn_id == turn_id)).all()
        )
        return json.loads(rows[0].messages) if rows and rows[0].messages else None

    async def get(self, conversation_id: str) -> ConversationRow | None:
        rows = await self.list(conversation_id=conversation_id, limit=1)
        return rows[0] if rows else None

    async def list(
        self, customer_id: str | None = None, conversation_id: str | None = None, limit: int = 50
    ) -> builtins.list[ConversationRow]:
        def work(conn: Any) -> builtins.list[ConversationRow]:
            query = select(conversations).order_by(conversations.c.updated_at.desc()).limit(limit)
            if customer_id:
                query = query.where(conversations.c.customer_id == customer_id)
            if conversation_id:
                query = query.where(conversations.c.conversation_id == conversation_id)
            found = [ConversationRow(**r) for r in conn.execute(query).mappings().all()]
            for row in found:
                stats = conn.execute(
                    select(exchanges.c.tokens).where(
                        exchanges.c.conversation_id == row.conversation_id, exchanges.c.messages.is_not(None)
                    )
                ).all()
                row.history_turns, row.history_tokens = len(stats), sum(s.tokens for s in stats)
            return found

        return await self._run(work)
