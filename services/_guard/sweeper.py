"""The sweeper: a timer over the ledger for the turns nothing moves any more.

Every change is conditional on the row as read, with the current time, so a turn that moved meanwhile is left alone.
Every publish of a sweep is bounded (`Bounded`): the sweeper never waits on Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from roundtrip._guard.approvals import Approvals
from roundtrip._guard.conversations import Conversations
from roundtrip._guard.external_ends import ExternalEnds, in_turn_trace
from roundtrip._guard.ledger import BATCH, ENDED, STUCK, Ledger, TurnRow
from roundtrip._guard.outbox import Bounded, Outbox
from roundtrip._kernel.kafka import faults
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.observability.telemetry import mark_error
from roundtrip._kernel.wire.events import Outcome, Turn, TurnFlagged

log = logging.getLogger("roundtrip.guard")

Flag = Callable[[TurnFlagged, str], Awaitable[None]]  # (the stuck flag, conversation id): publishes on turn.events
RETENTION_EVERY_S = 60.0


@dataclass
class Sweeper:
    ledger: Ledger
    outbox: Outbox
    external_ends: ExternalEnds
    approvals: Approvals
    stuck_after_s: float
    stuck_grace_s: float
    turn_deadline_s: float

    async def sweep(self, flag: Flag, now: float) -> tuple[int, int]:
        """Flag idle turns, end overdue ones, finish deferred ends, expire approvals, republish; (flagged, ended)."""
        idle, expired, ending = await self.ledger.overdue(
            now, self.stuck_after_s, self.stuck_grace_s, self.turn_deadline_s
        )
        announced = Bounded()
        flagged = 0
        for row in idle:
            flagged += await self._flag(row, now, flag, announced)
        ended = 0
        for row in expired:
            ended += await self._end_overdue(row, now, announced) == ENDED
        for row in ending:
            ended += await self.finish_ending(row, announced)
        ended += await self.approvals.expire(now, announced)
        if announced.reachable:
            await self.outbox.republish_all()
        return flagged, ended

    async def _flag(self, row: TurnRow, now: float, flag: Flag, announced: Bounded) -> bool:
        """Flag an idle turn stuck, once per stall (conditional on the step read)."""
        at = max(now, time.time())  # never a stale timestamp: it would shorten the grace
        if not await self.ledger.flag_stuck(row.turn_id, at, self.stuck_after_s, step=row.step):
            return False
        metrics.stuck_turns.inc()
        idle_s = at - row.last_progress_at
        detail = (
            f"no progress for {idle_s:.1f} s after step {row.step}; ending in {self.stuck_grace_s:g} s unless it moves"
        )
        with in_turn_trace(row, "guard.turn_stuck") as span:
            span.add_event(
                "turn stuck", {"roundtrip.turn_id": row.turn_id, "roundtrip.idle_s": idle_s, "roundtrip.step": row.step}
            )
            span.set_attribute("roundtrip.detail", detail)
            mark_error(span, f"stuck: {detail}", "stuck")
            log.warning(
                "turn %s is stuck: %s (customer %s, trace %s)", row.turn_id, detail, row.customer_id, row.trace_id
            )
            if announced.reachable:
                message = TurnFlagged(
                    turn=Turn.model_validate(row.turn), step=row.step, idle_s=round(idle_s, 3), detail=detail
                )
                await announced(lambda: flag(message, row.conversation_id), f"the stuck flag of {row.turn_id}")
        return True

    async def _end_overdue(self, row: TurnRow, now: float, announced: Bounded) -> str | None:
        """End a turn past its deadline, or stuck past its grace (only if still stuck since that very flag)."""
        if (row.deadline_at or row.started_at + self.turn_deadline_s) <= now:
            detail, since = self._too_old(row), {}
        else:
            detail, since = (
                f"stuck for more than {self.stuck_grace_s:g} s",
                {"status": STUCK, "flagged_at": row.flagged_at},
            )
        announce = announced.reachable
        return await announced(
            lambda: self.external_ends.end(row, Outcome.DEADLINE, detail, announce=announce, **since),
            f"the end of {row.turn_id}",
        )

    def _too_old(self, row: TurnRow) -> str:
        if row.lane == BATCH and row.deadline_at:  # a batch turn's own deadline (hours), not the fleet's turn deadline
            return f"batch turn older than {row.deadline_at - row.started_at:.0f} s"
        return f"turn older than {self.turn_deadline_s:g} s"

    async def finish_ending(self, row: TurnRow, announced: Bounded) -> bool:
        """An end that waited for a running step: record it and publish it once the lease is gone."""
        if not await self.ledger.finish_ending(row.turn_id, time.time()):
            return False
        done = await self.ledger.get(row.turn_id)
        if done is not None:  # the running step's side effects, recorded after the end was decided, are in its reply
            done = await self.external_ends.reworded(done)
        if done is not None and done.pending and announced.reachable:
            await announced(
                lambda: self.outbox.republish(done, "the running step finished"), f"the end of {row.turn_id}"
            )
        return True


async def run(sweeper: Sweeper, flag: Flag, interval_s: float, conversations: Conversations | None = None) -> None:
    """Sweep every interval_s, for ever, and expire conversations every RETENTION_EVERY_S; a failed sweep is retried."""
    expired_at, away_since, away = 0.0, None, ""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await sweeper.sweep(flag, time.time())
            if conversations is not None and time.monotonic() - expired_at > RETENTION_EVERY_S:
                expired_at = time.monotonic()
                if expired := await conversations.expire():
                    log.info("deleted %d conversations idle for more than %g s", expired, conversations.retention_s)
        except Exception as exc:  # the sweeper must outlive a database hiccup
            if (dependency := faults.unavailable(exc)) is None:
                log.exception("sweeping for stuck turns failed; will retry")
            elif away_since is None:  # said once per outage, not once per tick
                away_since, away = time.monotonic(), dependency
                log.warning(
                    "sweeping paused: the %s is unavailable (%s); retried every %g s", dependency, exc, interval_s
                )
            continue
        if away_since is not None:
            log.warning("sweeping again: the %s answered after %.1f s", away, time.monotonic() - away_since)
            away_since = None
