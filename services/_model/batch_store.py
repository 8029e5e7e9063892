"""The model service's record of each call of a batch turn (model_batch_calls, ledger_0008): queued (claimed, its
CallModel kept) -> submitting (taken, before `create`) -> in_batch (its batch id recorded) -> done (answer published),
or cancelled (its batch cancelled: the turns of all its calls ended).
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, or_, select, tuple_, update
from sqlalchemy.exc import IntegrityError

from roundtrip._kernel.storage.turnstore import (
    CALL_CANCELLED,
    CALL_DONE,
    CALL_IN_BATCH,
    CALL_QUEUED,
    CALL_SUBMITTING,
    TurnStore,
    batch_calls,
)

QUEUED, SUBMITTING, IN_BATCH, DONE, CANCELLED = CALL_QUEUED, CALL_SUBMITTING, CALL_IN_BATCH, CALL_DONE, CALL_CANCELLED
c = batch_calls.c
OPEN = or_(c.status == SUBMITTING, c.status == IN_BATCH)
MINE = (c.lease_owner == bindparam("b_owner")) | c.lease_until.is_(None) | (c.lease_until <= bindparam("b_now"))
AT = (c.turn_id == bindparam("b_turn_id")) & (c.step == bindparam("b_step"))
OF_SUBMISSION = (c.submission == bindparam("b_submission")) & (c.status == SUBMITTING)

_DUE = select(func.count(), func.min(c.queued_at)).where(c.status == QUEUED)
_OLDEST = select(c.grouping).where(c.status == QUEUED).order_by(c.queued_at).limit(1)
waiting = batch_calls.alias("waiting")  # the subquery's own name for the table: not correlated with the UPDATE's
_OLDEST_OF_GROUPING = (
    select(waiting.c.turn_id, waiting.c.step)
    .where(waiting.c.status == QUEUED, waiting.c.grouping == bindparam("b_grouping"))
    .order_by(waiting.c.queued_at, waiting.c.turn_id, waiting.c.step)
    .limit(bindparam("b_limit"))
)
_TAKE = (
    update(batch_calls)
    .where(c.status == QUEUED, tuple_(c.turn_id, c.step).in_(_OLDEST_OF_GROUPING))
    .values(
        status=SUBMITTING,
        submission=bindparam("b_submission"),
        submitted_at=bindparam("b_now"),
        lease_owner=bindparam("b_owner"),
        lease_until=bindparam("b_until"),
    )
)
_OF_SUBMISSION = select(batch_calls).where(OF_SUBMISSION).order_by(c.queued_at, c.turn_id, c.step)
_SUBMITTED = update(batch_calls).where(OF_SUBMISSION).values(status=IN_BATCH, batch_id=bindparam("b_batch_id"))
_REQUEUED = update(batch_calls).where(OF_SUBMISSION).values(status=QUEUED, submission=None, submitted_at=None)
_ADOPTED = (
    update(batch_calls)
    .where(OF_SUBMISSION, c.custom_id.in_(bindparam("b_custom_ids", expanding=True)))
    .values(status=IN_BATCH, batch_id=bindparam("b_batch_id"))
)
_LEASE = (
    update(batch_calls).where(OPEN, MINE).values(lease_owner=bindparam("b_owner"), lease_until=bindparam("b_until"))
)
_LEASED = (
    select(c.batch_id, c.submission, func.min(c.submitted_at))
    .where(OPEN, c.lease_owner == bindparam("b_owner"))
    .group_by(c.batch_id, c.submission)
)
_IN_BATCH = select(batch_calls).where(c.batch_id == bindparam("b_batch_id"), c.status == IN_BATCH)
_TURNS_IN = (
    select(c.turn_id).where(c.batch_id == bindparam("b_batch_id"), c.status == IN_BATCH).distinct().order_by(c.turn_id)
)
_ABANDONED = (
    update(batch_calls)
    .where(c.batch_id == bindparam("b_batch_id"), c.status == IN_BATCH)
    .values(status=CANCELLED, command_json=None, lease_owner=None, lease_until=None, done_at=bindparam("b_now"))
)
_KNOWN = select(c.batch_id).where(c.batch_id.in_(bindparam("b_ids", expanding=True))).distinct()
_DONE = (
    update(batch_calls)
    .where(AT)
    .values(status=DONE, command_json=None, lease_owner=None, lease_until=None, done_at=bindparam("b_now"))
)
_RETRY = (
    update(batch_calls)
    .where(AT, c.status != DONE)
    .values(
        status=QUEUED,
        retried=1,
        custom_id=bindparam("b_custom_id"),
        submission=None,
        submitted_at=None,
        batch_id=None,
        lease_owner=None,
        lease_until=None,
    )
)
_FORGET = delete(batch_calls).where(or_(c.status == DONE, c.status == CANCELLED), c.done_at < bindparam("b_before"))


class BatchCalls(TurnStore):
    """On the fence's engine (its pool): the model service's connections to the ledger stay the fence's."""

    @classmethod
    def beside(cls, store: TurnStore) -> BatchCalls:
        return cls(store.engine)

    async def close(self) -> None:
        """Its own kept connections only: the fence disposes of the engine."""
        for conn in (self._inline, self._inline_auto):
            if conn is not None:
                conn.close()
        self._inline = self._inline_auto = None

    async def record(self, row: dict[str, Any]) -> bool:
        """Keep a call queued; False when it was recorded already (a redelivered CallModel)."""
        statement = insert(batch_calls).values(**row, status=QUEUED, retried=0)
        try:
            await self._run(lambda conn: conn.execute(statement), write=True, single=True)
        except IntegrityError:
            return False
        return True

    async def due(self) -> tuple[int, float | None]:
        count, oldest = await self._run(lambda conn: conn.execute(_DUE).one(), single=True)
        return int(count), oldest

    async def take(self, owner: str, now: float, lease_s: float, limit: int) -> tuple[str, list[Any]]:
        """Up to `limit` queued calls of the oldest call's grouping, taken for a new submission leased to `owner`."""
        grouping = await self._run(lambda conn: conn.execute(_OLDEST).scalar(), single=True)
        if grouping is None:
            return "", []
        submission = f"sub_{uuid.uuid4().hex[:24]}"
        params = {"b_submission": submission, "b_now": now, "b_owner": owner, "b_until": now + lease_s}
        await self._update(_TAKE, {**params, "b_grouping": grouping, "b_limit": limit})
        return submission, await self.submitting(submission)

    async def submitting(self, submission: str) -> list[Any]:
        return await self._run(
            lambda conn: list(conn.execute(_OF_SUBMISSION, {"b_submission": submission})), single=True
        )

    async def submitted(self, submission: str, batch_id: str) -> None:
        await self._update(_SUBMITTED, {"b_submission": submission, "b_batch_id": batch_id})

    async def requeue(self, submission: str) -> None:
        """The calls of a submission whose batch was never created, queued again."""
        await self._update(_REQUEUED, {"b_submission": submission})

    async def adopt(self, submission: str, custom_ids: list[str], batch_id: str) -> None:
        """Calls of a submission found in a batch whose id was never recorded: theirs now."""
        params = {"b_submission": submission, "b_custom_ids": custom_ids, "b_batch_id": batch_id}
        await self._update(_ADOPTED, params)

    async def lease(self, owner: str, now: float, lease_s: float) -> list[tuple[str | None, str | None, float]]:
        """Take or keep the open calls no live lease holds; (batch id or None, submission, taken at) of those held."""
        params = {"b_owner": owner, "b_now": now, "b_until": now + lease_s}
        await self._update(_LEASE, params)
        rows = await self._run(lambda conn: list(conn.execute(_LEASED, {"b_owner": owner})), single=True)
        return [(batch_id, submission, submitted_at or now) for batch_id, submission, submitted_at in rows]

    async def in_batch(self, batch_id: str) -> dict[str, Any]:
        """The calls of a batch still waiting for their answers, by custom_id."""
        rows = await self._run(lambda conn: list(conn.execute(_IN_BATCH, {"b_batch_id": batch_id})), single=True)
        return {row.custom_id: row for row in rows}

    async def turns_in(self, batch_id: str) -> list[str]:
        """The turns whose calls wait in this batch."""
        return await self._run(
            lambda conn: list(conn.execute(_TURNS_IN, {"b_batch_id": batch_id}).scalars()), single=True
        )

    async def cancelled(self, batch_id: str, now: float) -> None:
        """The batch's waiting calls, cancelled with it: no longer polled, forgotten as done calls are."""
        await self._update(_ABANDONED, {"b_batch_id": batch_id, "b_now": now})

    async def known(self, batch_ids: list[str]) -> set[str]:
        if not batch_ids:
            return set()
        return await self._run(lambda conn: set(conn.execute(_KNOWN, {"b_ids": batch_ids}).scalars()), single=True)

    async def done(self, turn_id: str, step: int, now: float) -> None:
        await self._update(_DONE, {"b_turn_id": turn_id, "b_step": step, "b_now": now})

    async def retry(self, turn_id: str, step: int, custom_id: str) -> None:
        """The call queued again, once, under a custom_id of its own (its first batch's result failed)."""
        await self._update(_RETRY, {"b_turn_id": turn_id, "b_step": step, "b_custom_id": custom_id})

    async def forget(self, before: float) -> None:
        """Delete the calls answered before `before` (a redelivered CallModel of theirs finds its turn moved on)."""
        await self._run(lambda conn: conn.execute(_FORGET, {"b_before": before}), write=True, single=True)
