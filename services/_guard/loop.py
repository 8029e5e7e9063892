"""The loop decision: each model response (turn.iterations) is decided, recorded once, and sent on.

The step is recorded with one conditional update (the step before must be the one recorded, so a duplicate or a
racing replica is dropped); only a refused update reads the ledger, and a batch turn's step (its cost so far: each
call priced at its own rate). A finished turn's exchange is stored only once the ledger accepted its end: in the same
transaction when the conversations share the ledger's database, else right after it (docs/conversations.md, "Written
once the end is recorded").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry import trace
from sqlalchemy import Connection

from roundtrip._guard.conversations import Conversations
from roundtrip._guard.ledger import BATCH, ENDED, Ledger, TurnRow, digest_of
from roundtrip._guard.outbox import Outbox, pending_copy, traceparent
from roundtrip._guard.rules import Continue, Finish, Policy, decide
from roundtrip._guard.side_effects import SideEffects
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.observability.telemetry import ERROR_OUTCOMES, mark_error
from roundtrip._kernel.storage.prices import PriceTable
from roundtrip._kernel.storage.turnstore import disagreement, refused
from roundtrip._kernel.wire.events import CallModel, CheckToolCalls, ModelResponded, Outcome, TurnEnded

log = logging.getLogger("roundtrip.guard")


def continued(event: ModelResponded, decision: Continue, span: trace.Span) -> CallModel | CheckToolCalls:
    """The next hop of a turn that goes on: its tool calls to the gate, or (nothing to run) the model again."""
    transcript = [*event.messages, {"role": "assistant", "content": event.content}]
    if decision.resume_model:
        return CallModel(turn=event.turn, step=event.step, messages=transcript, spent=event.spent)
    if decision.blocked:
        span.add_event("repeat of a failed call blocked", {"roundtrip.blocked": list(decision.blocked)})
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

    LIMIT = 100_000  # turns remembered at once; past it a step goes unmeasured rather than memory growing

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def stepped(self, turn_id: str, ended: bool) -> None:
        now = time.monotonic()
        if (last := self._last.pop(turn_id, None)) is not None:
            metrics.step_seconds.observe(now - last)
        if not ended and len(self._last) < self.LIMIT:
            self._last[turn_id] = now

    def forget(self, turn_id: str) -> None:
        """What comes next is not a step of the loop (an end from outside, a wait for a person)."""
        self._last.pop(turn_id, None)


@dataclass(frozen=True)
class Decided:
    """The guard's decision on one iteration: the turn's next message, its outcome if it ends, what it cost."""

    message: CallModel | CheckToolCalls | TurnEnded
    outcome: str | None
    cost: float
    step_cost: float
    model: str
    detail: str  # why the turn ends ("" when it goes on)


@dataclass
class Decisions:
    """The loop's rules on one iteration, before any ledger: its cost, the policy's decision, the next message (an
    early end after a side effect says what was done, in the agent's words)."""

    policy: Policy
    prices: PriceTable
    model: str  # the fleet's model, for an iteration that names none
    side_effects: SideEffects

    def decided(self, event: ModelResponded, span: trace.Span, earlier_usd: float | None = None) -> Decided:
        """`earlier_usd`: the turn's earlier calls as the ledger priced them, each at its rate (a batch turn's); None:
        the turn's tokens at this call's price (an interactive turn's calls are all direct)."""
        model = event.model or self.model
        step_cost = self.prices.cost(model, event.usage, batch=bool(event.batch_id))
        cost = self.prices.cost(model, event.spent) if earlier_usd is None else earlier_usd + step_cost
        decision = decide(event, self.policy, cost, step_cost)
        span.set_attribute("roundtrip.decision", type(decision).__name__)
        if isinstance(decision, Continue):
            return Decided(continued(event, decision, span), None, cost, step_cost, model, "")
        ended = self._finished(event, decision, cost, span)
        return Decided(ended, decision.outcome.value, cost, step_cost, model, decision.detail)

    def _finished(self, event: ModelResponded, decision: Finish, cost: float, span: trace.Span) -> TurnEnded:
        outcome = decision.outcome.value
        text = self.side_effects.reply(
            decision.outcome, decision.text, self.side_effects.done(event.messages[event.turn.history_messages :])
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


@dataclass
class Loop:
    ledger: Ledger
    outbox: Outbox
    decisions: Decisions
    conversations: Conversations | None  # None: every request stands alone (no conversation store)
    steps: StepClock

    async def on_iteration(self, event: ModelResponded) -> str:
        span = trace.get_current_span()
        decided = self.decisions.decided(event, span, await self._earlier_usd(event))
        message, outcome, cost, step_cost, model = (
            decided.message,
            decided.outcome,
            decided.cost,
            decided.step_cost,
            decided.model,
        )
        pending = pending_copy(message)
        history = self._history(event, message) if isinstance(message, TurnEnded) else None
        shared = history is not None and self.conversations is not None and self.conversations.shares(self.ledger)
        if await self.ledger.advance(
            event.turn,
            event.step,
            event.spent.model_dump(),
            cost,
            pending,
            outcome=outcome,
            traceparent=traceparent(),
            then=history if shared else None,
            now=time.time(),
        ):
            if history is not None and not shared and self.conversations is not None:
                await self.conversations.store(history)  # before the end is published: the next turn waits for it
            # counted once, when the ledger records the step (a redelivery that republishes counts nothing again)
            metrics.count_usage(model, event.usage, step_cost)
            if isinstance(message, CheckToolCalls) and message.blocked:
                metrics.guard_blocked_calls.inc(len(message.blocked))
            if outcome:
                metrics.count_turn_end(outcome, event.step, event.turn.agent_version)
            self.steps.stepped(event.turn.turn_id, ended=bool(outcome))
            await self.outbox.emit(event.turn.turn_id, pending, message, event.turn.conversation_id)
            return outcome or type(message).__name__
        return await self._not_advanced(event, span, message, pending)

    async def _earlier_usd(self, event: ModelResponded) -> float | None:
        """A batch turn's cost up to the step before, as recorded (one read a step: its steps take minutes)."""
        if event.turn.lane != BATCH:
            return None
        row = await self.ledger.get(event.turn.turn_id)
        return row.cost_usd if row is not None and row.step == event.step - 1 else None

    def _history(
        self, event: ModelResponded, ended: TurnEnded, only_open: bool = False
    ) -> Callable[[Connection], bool] | None:
        """The writes of the turn's exchange, run once the ledger accepted its end; None without a store."""
        if self.conversations is None:
            return None
        return self.conversations.closing(
            event.turn.conversation_id,
            event.turn.turn_id,
            event.messages[event.turn.history_messages :],
            event.content,
            ended.text,
            ended.outcome.value,
            time.time(),
            only_open=only_open,
        )

    async def _not_advanced(
        self, event: ModelResponded, span: trace.Span, message: CallModel | CheckToolCalls | TurnEnded, pending: str
    ) -> str:
        """Why the ledger refused the step: a redelivery (republish), a duplicate, a gap. A turn the ledger does not
        have (never started, or deleted by retention) is refused: nothing may write its conversation's history."""
        row = await self.ledger.get(event.turn.turn_id)
        if (why := disagreement(event.turn, row)) is not None:
            raise refused(event.turn, "guard", why)  # dead-lettered: another customer's or conversation's copy
        assert row is not None
        if isinstance(message, TurnEnded):
            await self._stored_late(event, message, pending, row)
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

    async def _stored_late(self, event: ModelResponded, ended: TurnEnded, pending: str, row: TurnRow) -> None:
        """Separate databases: the redelivered end whose exchange a crash left unwritten after the ledger recorded
        it. Only the end the ledger recorded (its step, its reply's digest) and only while the exchange is open."""
        if self.conversations is None or self.conversations.shares(self.ledger):
            return
        if row.status != ENDED or event.step != row.step or row.reply_sha256 != digest_of(pending):
            return
        if (history := self._history(event, ended, only_open=True)) is not None:
            await self.conversations.store(history)
