"""Ends from outside the loop (a cancel, a stuck turn, a deadline, an expired approval): each ends the turn politely,
once, and never while its calls run."""

from __future__ import annotations

import json
import logging
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry import trace

from roundtrip._guard.conversations import Conversations
from roundtrip._guard.ledger import AWAITING, ENDED, ENDING, Ledger, TurnRow
from roundtrip._guard.loop import StepClock
from roundtrip._guard.outbox import Outbox, pending_copy
from roundtrip._guard.side_effects import SideEffects
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.observability.telemetry import ERROR_OUTCOMES, mark_error, span_in_turn
from roundtrip._kernel.storage.turnstore import disagreement, refused
from roundtrip._kernel.wire.events import CancelTurn, Outcome, Turn, TurnEnded, Usage

log = logging.getLogger("roundtrip.guard")


def in_turn_trace(row: TurnRow, name: str) -> AbstractContextManager[trace.Span]:
    """A span in the turn's own trace (under the turn span, linked to its last hop): Jaeger shows it with the turn."""
    return span_in_turn(name, Turn.model_validate(row.turn), row.traceparent, row.step)


def spent_of(row: TurnRow) -> Usage:
    return Usage(
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
        cache_creation_input_tokens=row.cache_creation_input_tokens,
        cache_read_input_tokens=row.cache_read_input_tokens,
    )


@dataclass
class ExternalEnds:
    ledger: Ledger
    outbox: Outbox
    conversations: Conversations | None  # None: every request stands alone
    steps: StepClock
    side_effects: SideEffects = field(kw_only=True)

    async def end(self, row: TurnRow, outcome: Outcome, detail: str, announce: bool = True, **seen: Any) -> str | None:
        """End it politely, once, conditional on the state it was decided from (`row.step`, and `seen`).

        While an executor's calls run, the turn becomes ENDING, ended by the sweeper once the lease is released.
        Returns ENDED, ENDING, or None. `announce` False (the broker is away) only records."""
        text = self.side_effects.ending(outcome, self.side_effects.recorded(row.acted))
        ended = TurnEnded(
            turn=Turn.model_validate(row.turn),
            step=row.step,
            outcome=outcome,
            text=text,
            spent=spent_of(row),
            cost_usd=round(row.cost_usd, 6),
        )
        pending = pending_copy(ended)
        with in_turn_trace(row, f"guard.{outcome.value}") as span:
            span.set_attributes(
                {"roundtrip.turn_id": row.turn_id, "roundtrip.outcome": outcome.value, "roundtrip.detail": detail}
            )
            if outcome.value in ERROR_OUTCOMES:
                mark_error(span, f"{outcome.value}: {detail}", outcome.value)
            if self.conversations is not None:
                await self.conversations.close_turn_with_reply(
                    row.conversation_id, row.turn_id, ended.text, outcome.value
                )
            result = await self.ledger.end(
                row.turn_id, outcome.value, pending, step=row.step, now=time.time(), defer=True, **seen
            )
            if result is None:
                span.add_event("not ended: the turn moved since the decision", {"roundtrip.step": row.step})
                return None
            if result == ENDING:
                span.add_event("end deferred: an executor is running this step's calls", {"roundtrip.step": row.step})
                log.warning(
                    "turn %s: %s decided (%s); waiting for the running step %d to finish",
                    row.turn_id,
                    outcome.value,
                    detail,
                    row.step,
                )
                return ENDING
            log.warning(
                "turn %s ended from outside the loop: %s (%s) trace %s",
                row.turn_id,
                outcome.value,
                detail,
                row.trace_id,
            )
            metrics.count_turn_end(outcome, row.step, row.agent_version or "")
            self.steps.forget(row.turn_id)
            if announce:
                await self.outbox.emit(row.turn_id, pending, ended, row.conversation_id)
            return ENDED

    async def reworded(self, row: TurnRow) -> TurnRow:
        """A deferred end whose running step had side effects, recorded after the end was decided: its reply is
        worded again from them before it goes out."""
        if not row.pending or not row.acted:
            return row
        ended = TurnEnded.model_validate(json.loads(row.pending)["message"])
        text = self.side_effects.ending(ended.outcome, self.side_effects.recorded(row.acted))
        if text == ended.text:
            return row
        pending = pending_copy(ended.model_copy(update={"text": text}))
        if not await self.ledger.reword(row.turn_id, row.pending, pending):
            return row
        if self.conversations is not None:
            await self.conversations.close_turn_with_reply(row.conversation_id, row.turn_id, text, ended.outcome.value)
        return replace(row, pending=pending)

    async def on_cancel(self, command: CancelTurn) -> str:
        """A cancel ends the turn wherever it is (a waiting approval closes with it); retried while the turn moves.
        One naming another customer or conversation than the ledger's is refused (dead-lettered)."""
        detail = f"{command.reason} [by {command.requested_by or 'unnamed'}]"
        for _ in range(10):  # re-read and retry while the turn keeps moving under the cancel
            row = await self.ledger.get(command.turn_id)
            if row is None:
                return "unknown turn"
            if (why := disagreement(command, row)) is not None:
                raise refused(command, "guard", f"cancel: {why}")
            if row.status in (ENDED, ENDING):
                return "already ended"
            result = await self.end(row, Outcome.CANCELLED, detail)
            if result is not None and row.status == AWAITING:
                await self.ledger.close_approvals(row.turn_id, "ended")
            if result == ENDED:
                return "cancelled"
            if result == ENDING:
                return "cancelling"
        log.warning("turn %s: cancel gave up: the turn kept moving", command.turn_id)
        return "not cancelled"
