"""The loop decision: each model response (turn.iterations) is decided, recorded once, and sent on.

The step is recorded with one conditional update (the step before must be the one recorded, so a duplicate or a
racing replica is dropped); only a refused update reads the ledger. A finished turn's exchange is stored before its
end is recorded, so the conversation's next turn, waiting for that end, sees it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from opentelemetry import trace

from roundtrip._guard.conversations import Conversations
from roundtrip._guard.ledger import ENDED, Ledger
from roundtrip._guard.outbox import Outbox, pending_copy, traceparent
from roundtrip._guard.pricing import PriceTable
from roundtrip._guard.rules import Continue, Finish, Policy, decide
from roundtrip._guard.side_effects import Acts
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.observability.telemetry import ERROR_OUTCOMES, mark_error
from roundtrip._kernel.storage.turnstore import disagreement, refused
from roundtrip._kernel.wire.events import CallModel, CheckToolCalls, ModelResponded, Outcome, TurnEnded

log = logging.getLogger("roundtrip.guard")


def continued(event: ModelResponded, decision: Continue, span: trace.Span | None = None) -> CallModel | CheckToolCalls:
    """The next hop of a turn that goes on: its tool calls to the gate, or (nothing to run) the model again."""
    transcript = [*event.messages, {"role": "assistant", "content": event.content}]
    if decision.resume_model:
        return CallModel(turn=event.turn, step=event.step, messages=transcript, spent=event.spent)
    if decision.blocked:
        (span or trace.get_current_span()).add_event(
            "repeat of a failed call blocked", {"roundtrip.blocked": list(decision.blocked)}
        )
    return CheckToolCalls(
        turn=event.turn,
        step=event.step,
        messages=transcript,
        calls=event.tool_calls,
        spent=event.spent,
        blocked=decision.blocked,
    )


class StepClock:
    """roundtrip_step_seconds: from a turn's decision on this replica to its next."""

    def __init__(self, limit: int = 100_000) -> None:
        self._last: dict[str, float] = {}
        self._limit = limit

    def stepped(self, turn_id: str, ended: bool) -> None:
        now = time.monotonic()
        if (last := self._last.pop(turn_id, None)) is not None:
            metrics.step_seconds.observe(now - last)
        if not ended and len(self._last) < self._limit:
            self._last[turn_id] = now

    def forget(self, turn_id: str) -> None:
        """What comes next is not a step of the loop (an end from outside, a wait for a person)."""
        self._last.pop(turn_id, None)


@dataclass
class Loop:
    ledger: Ledger
    outbox: Outbox
    policy: Policy
    prices: PriceTable
    model: str = ""
    conversations: Conversations | None = None  # None: every request stands alone (no conversation store)
    steps: StepClock = field(default_factory=StepClock)
    acts: Acts = field(kw_only=True)  # the agent's side effects: an early end after one says what was done

    async def on_iteration(self, event: ModelResponded) -> str:
        span = trace.get_current_span()
        model = event.model or self.model
        cost, step_cost = self.prices.cost(model, event.spent), self.prices.cost(model, event.usage)
        decision = decide(event, self.policy, cost, step_cost)
        span.set_attribute("roundtrip.decision", type(decision).__name__)
        message: CallModel | CheckToolCalls | TurnEnded
        if isinstance(decision, Continue):
            message, outcome = continued(event, decision, span), None
        else:
            message, outcome = await self._finished(event, decision, cost, span), decision.outcome.value
        pending = pending_copy(message)
        if await self.ledger.advance(
            event.turn,
            event.step,
            event.spent.model_dump(),
            cost,
            pending,
            outcome=outcome,
            traceparent=traceparent(),
        ):
            # counted once, when the ledger records the step (a redelivery that republishes counts nothing again)
            metrics.count_usage(model, event.usage, step_cost)
            if isinstance(message, CheckToolCalls) and message.blocked:
                metrics.guard_blocked_calls.inc(len(message.blocked))
            if outcome:
                metrics.count_turn_end(outcome, event.step)
            self.steps.stepped(event.turn.turn_id, ended=bool(outcome))
            await self.outbox.emit(event.turn.turn_id, pending, message, event.turn.conversation_id)
            return outcome or type(message).__name__
        return await self._not_advanced(event, span)

    async def _finished(self, event: ModelResponded, decision: Finish, cost: float, span: trace.Span) -> TurnEnded:
        outcome = decision.outcome.value
        text = self.acts.reply(
            decision.outcome, decision.text, self.acts.done(event.messages[event.turn.history_messages :])
        )
        ended = TurnEnded(
            turn=event.turn,
            step=event.step,
            outcome=decision.outcome,
            text=text,
            spent=event.spent,
            cost_usd=round(cost, 6),
        )
        span.set_attribute("roundtrip.outcome", outcome)
        if decision.detail:
            span.set_attribute("roundtrip.detail", decision.detail)
        if outcome in ERROR_OUTCOMES:
            mark_error(span, f"{outcome}: {decision.detail}" if decision.detail else outcome, outcome)
        if self.conversations is not None:  # stored before the end is recorded: the next turn waits for the end
            # only the turn's own customer's end may write its conversation's history
            await self.ledger.refuse_if_not_recorded(event.turn, "guard")
            await self.conversations.close_turn(
                event.turn.conversation_id,
                event.turn.turn_id,
                event.messages[event.turn.history_messages :],
                event.content,
                ended.text,
                outcome,
            )
        if decision.outcome not in (Outcome.END_TURN,):
            log.warning(
                "turn %s ended at step %d: %s (%s) trace %s",
                event.turn.turn_id,
                event.step,
                outcome,
                decision.detail,
                event.turn.trace_id,
            )
        return ended

    async def _not_advanced(self, event: ModelResponded, span: trace.Span) -> str:
        """Why the ledger refused the step: a redelivery (republish), a duplicate, a gap."""
        row = await self.ledger.get(event.turn.turn_id)
        if row is None:
            log.warning("turn %r: iteration for a turn the ledger does not know; dropped", event.turn.turn_id)
            return "unknown turn"
        if (why := disagreement(event.turn, row)) is not None:
            raise refused(event.turn, "guard", why)  # dead-lettered: another customer's or conversation's copy
        if event.step == row.step and row.pending:
            await self.outbox.republish(row)
            return "republished"
        if row.status == ENDED or event.step <= row.step:
            span.add_event(
                "duplicate or late iteration dropped", {"ledger.step": row.step, "ledger.status": row.status}
            )
            return "duplicate"
        log.warning("turn %s: iteration %d arrived after %d; dropped", event.turn.turn_id, event.step, row.step)
        return "out of order"
