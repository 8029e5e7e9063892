"""The turn ledger: one row per turn with its status, step, progress, usage, cost and outcome.

Every change is a conditional UPDATE, so a redelivered event or a second guard replica cannot move a turn twice: the
caller that gets rowcount 1 owns the transition. Every end is conditional on the state it was decided from and on no
executor holding a lease on the turn. `pending` is the outbox: the message a transition decided to publish, kept
until it is published.
"""

from __future__ import annotations

import builtins  # TurnReads.list shadows the builtin in the annotations that follow it
import json
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, bindparam, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from roundtrip._kernel.database import make_engine
from roundtrip._kernel.storage.ledger_reads import PENDING, ApprovalRow, TurnReads, TurnRow
from roundtrip._kernel.storage.turnstore import (
    AT_STEP,
    AWAITING,
    BATCH,
    ENDED,
    ENDING,
    IN_BATCH,
    INTERACTIVE,
    IS_LIVE,
    LIVE,
    OF_PRINCIPAL,
    OPEN,
    RUNNING,
    STUCK,
    Principal,
    approvals,
    no_live_lease,
    principal,
    reply_digest,
    turns,
)
from roundtrip._kernel.storage.versions import Versions

__all__ = [
    "AWAITING",
    "BATCH",
    "ENDED",
    "ENDING",
    "LIVE",
    "PENDING",
    "RUNNING",
    "STUCK",
    "ApprovalRow",
    "Ledger",
    "TurnRow",
    "make_engine",
    "turns",
]


def digest_of(pending: str) -> str | None:
    """The `reply_sha256` of an end whose pending copy (outbox.pending_copy) is `pending`: what the gateway checks.
    None for anything else: no reply may then be sent for it."""
    try:
        return reply_digest(json.loads(pending)["message"]["text"])
    except (ValueError, TypeError, KeyError):
        return None


class _Refused(Exception):
    """Rolls a two-statement transition back when its second statement changes nothing."""


OUTBOX_BATCH = 500  # the undelivered decisions one outbox pass republishes, oldest first

# built once; `b_` names are the conditions
_START = insert(turns)
_ADVANCE = update(turns).where(AT_STEP, OF_PRINCIPAL, IS_LIVE)
_LIVE_TURNS = select(turns).where(
    turns.c.conversation_id == bindparam("b_conversation_id"),
    turns.c.status != ENDED,
    turns.c.turn_id != bindparam("b_but"),
)
_STARTING = select(turns).where(
    or_(
        turns.c.turn_id == bindparam("b_turn_id"),
        (turns.c.conversation_id == bindparam("b_conversation_id")) & (turns.c.status != ENDED),
    )
)
_PUBLISHED = update(turns).where(
    turns.c.turn_id == bindparam("b_turn_id"), turns.c.pending == bindparam("b_pending"), turns.c.status != ENDING
)


class LedgerApprovals(TurnReads):
    """The approval table: a held call and a person's decision, each written in one transaction with the turn's row."""

    async def await_approval(self, approval: dict[str, Any], pending: str | None) -> bool:
        """Record a held call and the turn as AWAITING, in one transaction: while it waits no claim succeeds, the stuck
        rule skips it, the step's lease is released, and its deadline is the approval's."""
        now = time.time()

        def work(conn: Any) -> bool:
            moved = conn.execute(
                update(turns)
                .where(
                    turns.c.turn_id == approval["turn_id"],
                    turns.c.step == approval["step"],
                    turns.c.customer_id == approval["customer_id"],
                    turns.c.conversation_id == approval["conversation_id"],
                    turns.c.status.in_(LIVE),
                )
                .values(
                    status=AWAITING,
                    last_progress_at=now,
                    flagged_at=None,
                    lease_step=None,
                    lease_until=None,
                    deadline_at=approval["expires_at"],
                    pending=pending,
                    pending_at=now if pending else None,
                )
            ).rowcount
            if moved != 1:
                return False
            conn.execute(insert(approvals).values(status=PENDING, **approval))
            return True

        try:
            return await self._run(work, write=True)
        except IntegrityError:  # the approval exists already: the same request twice
            return False

    async def decide(
        self,
        approval_id: str,
        status: str,
        decided_by: str,
        decided_at: float,
        decision_reason: str,
        pending: str,
        deadline_at: float | None,
        now: float | None = None,
    ) -> bool:
        """The decision and the turn AWAITING -> RUNNING with its next message, together; False when that is stale."""
        now = now or time.time()

        def work(conn: Any) -> bool:
            row = conn.execute(
                select(approvals.c.turn_id, approvals.c.step).where(approvals.c.approval_id == approval_id)
            ).first()
            if row is None:
                return False
            if (
                conn.execute(
                    update(approvals)
                    .where(approvals.c.approval_id == approval_id, approvals.c.status == PENDING)
                    .values(
                        status=status, decided_by=decided_by, decided_at=decided_at, decision_reason=decision_reason
                    )
                ).rowcount
                != 1
            ):
                return False
            values: dict[str, Any] = dict(status=RUNNING, last_progress_at=now, pending=pending, pending_at=now)
            if deadline_at:
                values["deadline_at"] = deadline_at
            if (
                conn.execute(
                    update(turns)
                    .where(turns.c.turn_id == row.turn_id, turns.c.step == row.step, turns.c.status == AWAITING)
                    .values(**values)
                ).rowcount
                != 1
            ):
                raise _Refused  # the turn ended meanwhile: the approval stays pending (then closed with the turn)
            return True

        try:
            return await self._run(work, write=True)
        except _Refused:
            return False

    async def close_approvals(self, turn_id: str, status: str, now: float | None = None) -> int:
        now = now or time.time()
        return await self._run(
            lambda conn: (
                conn.execute(
                    update(approvals)
                    .where(approvals.c.turn_id == turn_id, approvals.c.status == PENDING)
                    .values(status=status, decided_at=now)
                ).rowcount
            ),
            write=True,
        )


class Ledger(LedgerApprovals, Versions):  # Versions: the ramp's shares each start reads
    async def start(
        self,
        turn: dict[str, Any],
        pending: str,
        traceparent: str | None = None,
        now: float | None = None,
        deadline_at: float | None = None,
        outcome: str | None = None,
        agent_digest: str | None = None,
        agent_version: str = "",
    ) -> bool:
        """Register a new turn (already ended with `outcome`, for a refused one); False for a duplicated request."""
        now = now or time.time()
        row = dict(
            turn_id=turn["turn_id"],
            request_id=turn["request_id"],
            conversation_id=turn["conversation_id"],
            customer_id=turn["customer_id"],
            status=ENDED if outcome else RUNNING,
            step=0,
            started_at=now,
            last_progress_at=now,
            trace_id=turn.get("trace_id", ""),
            traceparent=traceparent,
            turn_json=json.dumps(turn),
            pending=pending,
            pending_at=now,
            deadline_at=deadline_at or turn.get("deadline_at"),
            outcome=outcome,
            ended_at=now if outcome else None,
            reply_sha256=digest_of(pending) if outcome else None,
            input_tokens=0,
            output_tokens=0,
            cache_creation_input_tokens=0,
            cache_read_input_tokens=0,
            cost_usd=0.0,
            agent_digest=agent_digest,
            lane=turn.get("lane") or INTERACTIVE,
            agent_version=agent_version,
        )
        try:
            await self._run(lambda conn: conn.execute(_START, row), write=True, single=True)
            return True
        except IntegrityError:
            return False

    async def advance(
        self,
        turn: Principal,
        step: int,
        usage: dict[str, int],
        cost_usd: float,
        pending: str,
        *,
        outcome: str | None,
        traceparent: str | None,
        then: Callable[[Connection], Any] | None,
        now: float,
    ) -> bool:
        """Record iteration `step`: only from step-1, a live turn, its own customer and conversation. `then` runs in
        the same transaction once the step is recorded (an end's history, when the conversations share the ledger's
        database)."""
        values: dict[str, Any] = dict(
            step=step,
            last_progress_at=now,
            flagged_at=None,
            cost_usd=cost_usd,
            pending=pending,
            pending_at=now,
            status=ENDED if outcome else RUNNING,
            traceparent=traceparent,
            lease_step=None,
            lease_until=None,
            **usage,
        )
        if outcome:
            values.update(outcome=outcome, ended_at=now, reply_sha256=digest_of(pending))
        params = {**principal(turn), "b_step": step - 1, **values}
        if then is None:
            return await self._update(_ADVANCE, params)

        def work(conn: Connection) -> bool:
            if conn.execute(_ADVANCE, params).rowcount != 1:
                return False
            then(conn)
            return True

        return await self._run(work, write=True)

    async def end(
        self,
        turn_id: str,
        outcome: str,
        pending: str,
        *,
        step: int | None = None,
        status: str | None = None,
        flagged_at: float | None = None,
        now: float | None = None,
        defer: bool = False,
    ) -> str | None:
        """End a live turn from outside the loop if it is as the caller saw it; ENDED, ENDING, or None. A live lease
        blocks the end: with `defer` the turn becomes ENDING (no claim succeeds any more) for `finish_ending`."""
        now = now or time.time()
        digest = digest_of(pending)
        seen = [turns.c.turn_id == turn_id, turns.c.status.in_(OPEN)]
        if step is not None:
            seen.append(turns.c.step == step)
        if status is not None:
            seen.append(turns.c.status == status)
        if flagged_at is not None:
            seen.append(turns.c.flagged_at == flagged_at)
        if await self._update(
            update(turns)
            .where(*seen, no_live_lease(now))
            .values(status=ENDED, outcome=outcome, ended_at=now, pending=pending, pending_at=now, reply_sha256=digest)
        ):
            return ENDED
        if defer and await self._update(
            update(turns)
            .where(*seen)
            .values(status=ENDING, outcome=outcome, pending=pending, pending_at=now, reply_sha256=digest)
        ):
            return ENDING
        return None

    async def finish_ending(self, turn_id: str, now: float) -> bool:
        """ENDING -> ENDED once no executor lease is live."""
        return await self._update(
            update(turns)
            .where(turns.c.turn_id == turn_id, turns.c.status == ENDING, no_live_lease(now))
            .values(status=ENDED, ended_at=now, pending_at=now)
        )

    async def reword(self, turn_id: str, pending: str, reworded: str) -> bool:
        """Replace the unpublished decision `pending` by `reworded`; False when it changed or went out meanwhile."""
        return await self._update(
            update(turns)
            .where(turns.c.turn_id == turn_id, turns.c.pending == pending)
            .values(pending=reworded, reply_sha256=digest_of(reworded))
        )

    async def flag_stuck(self, turn_id: str, now: float, stuck_after_s: float, step: int | None) -> bool:
        conditions = [
            turns.c.turn_id == turn_id,
            turns.c.status == RUNNING,
            ~IN_BATCH,
            turns.c.last_progress_at <= now - stuck_after_s,
        ]
        if step is not None:
            conditions.append(turns.c.step == step)
        return await self._update(update(turns).where(*conditions).values(status=STUCK, flagged_at=now))

    async def published(self, turn_id: str, pending: str) -> None:
        """The decision `pending` is out; a newer decision written meanwhile is left alone."""
        await self.published_many([(turn_id, pending)])

    async def published_many(self, decisions: list[tuple[str, str]]) -> None:
        """`published` for many decisions, in autocommit: a lost clear only means a republish."""
        if not decisions:
            return
        rows = [
            {"b_turn_id": turn_id, "b_pending": pending, "pending": None, "pending_at": None}
            for turn_id, pending in decisions
        ]
        await self._run(lambda conn: conn.execute(_PUBLISHED, rows), write=True, single=True)

    async def release_ending_lease(self, turn_id: str, step: int) -> bool:
        """An end waits for this step's calls, which are done: let it go now."""
        return await self._update(
            update(turns)
            .where(turns.c.turn_id == turn_id, turns.c.step == step, turns.c.status == ENDING)
            .values(lease_until=None)
        )

    async def overdue_approvals(self, now: float) -> list[tuple[ApprovalRow, TurnRow]]:
        pending = await self._approval_rows(
            select(approvals)
            .where(approvals.c.status == PENDING, approvals.c.expires_at <= now)
            .where(approvals.c.turn_id.in_(select(turns.c.turn_id).where(turns.c.status == AWAITING)))
        )
        out = []
        for row in pending:
            turn = await self.get(row.turn_id)
            if turn is not None:
                out.append((row, turn))
        return out

    async def starting(self, turn_id: str, conversation_id: str) -> tuple[TurnRow | None, list[TurnRow]]:
        """In one read: the turn's row (None: a new turn) and the other live turns of its conversation."""
        rows = await self._rows(_STARTING, {"b_turn_id": turn_id, "b_conversation_id": conversation_id})
        this = next((r for r in rows if r.turn_id == turn_id), None)
        return this, [r for r in rows if r.turn_id != turn_id]

    async def live_turns(self, conversation_id: str, but: str) -> list[TurnRow]:
        return await self._rows(_LIVE_TURNS, {"b_conversation_id": conversation_id, "b_but": but})

    async def overdue(
        self, now: float, stuck_after_s: float, grace_s: float, deadline_s: float
    ) -> tuple[builtins.list[TurnRow], builtins.list[TurnRow], builtins.list[TurnRow]]:
        """(running turns idle past stuck_after_s, live turns past their grace or deadline, ending turns); a batch turn
        waiting for its Message Batch is neither idle nor past a grace, only ever past its deadline."""
        idle = await self._rows(
            select(turns).where(turns.c.status == RUNNING, turns.c.last_progress_at < now - stuck_after_s, ~IN_BATCH)
        )
        # a turn with a deadline is judged by it alone: an approval's wait moved it
        past_deadline = turns.c.deadline_at.is_(None) & (turns.c.started_at < now - deadline_s)
        if deadline_s:
            past_deadline = past_deadline | (turns.c.deadline_at <= now)
        expired = await self._rows(
            select(turns).where(
                turns.c.status.in_(LIVE),
                ((turns.c.status == STUCK) & (turns.c.flagged_at < now - grace_s) & ~IN_BATCH) | past_deadline,
            )
        )
        ending = await self._rows(select(turns).where(turns.c.status == ENDING))
        return idle, expired, ending

    async def outbox(self, older_than: float) -> builtins.list[TurnRow]:
        """Turns whose decided message may not be out yet (written before `older_than`), oldest first."""
        return await self._rows(
            select(turns)
            .where(
                turns.c.pending.is_not(None),
                turns.c.status != ENDING,
                turns.c.pending_at.is_(None) | (turns.c.pending_at < older_than),
            )
            .order_by(turns.c.pending_at)
            .limit(OUTBOX_BATCH)
        )
