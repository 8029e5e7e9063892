"""Guard handlers: every turn starts here, every iteration passes here, stuck turns end here.

Each handler decides, records the decision in the ledger with a conditional update
(so a duplicate or a racing replica is recognised and dropped), then publishes exactly
one next message: CallModel, CheckToolCalls or TurnEnded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.propagate import inject
from pydantic import BaseModel

from services.guard.ledger import ENDED, Ledger, TurnRow
from services.guard.pricing import PriceTable
from services.guard.replies import polite
from services.guard.rules import Continue, Finish, Policy, decide
from services.kernel import metrics, topics
from services.kernel.events import (
    CallModel, CancelTurn, CheckToolCalls, ModelResponded, Outcome, StartTurn, Turn, TurnEnded, TurnFlagged, Usage,
)
from services.kernel.telemetry import ERROR_OUTCOMES, mark_error, span_in_turn

log = logging.getLogger("roundtrip.guard")

Publish = Callable[[str, BaseModel, str], Awaitable[None]]  # (logical topic, message, conversation id)
TOPIC_OF = {CallModel: topics.MODEL_CALLS, CheckToolCalls: topics.TOOL_CALLS, TurnEnded: topics.OUTCOMES}
MODEL_OF = {topic: model for model, topic in TOPIC_OF.items()}


def _pending(message: BaseModel) -> str:
    return json.dumps({"topic": TOPIC_OF[type(message)], "message": message.model_dump(mode="json")})


def _traceparent() -> str | None:
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")


def usage_columns(usage: Usage) -> dict[str, int]:
    return usage.model_dump()


def spent_of(row: TurnRow) -> Usage:
    return Usage(input_tokens=row.input_tokens, output_tokens=row.output_tokens,
                 cache_creation_input_tokens=row.cache_creation_input_tokens, cache_read_input_tokens=row.cache_read_input_tokens)


@dataclass
class Guard:
    ledger: Ledger
    policy: Policy
    prices: PriceTable
    publish: Publish
    model: str = ""
    stuck_after_s: float = 60.0
    stuck_grace_s: float = 30.0
    turn_deadline_s: float = 300.0

    def __post_init__(self) -> None:
        self._clearing: set[asyncio.Task] = set()
        self._last_decision: dict[str, float] = {}  # turn id -> monotonic time of its last decision (step latency)

    def _stepped(self, turn_id: str, ended: bool) -> None:
        """Observe one round trip of the loop: from this turn's previous decision (on this replica) to this one."""
        now = time.monotonic()
        if (last := self._last_decision.pop(turn_id, None)) is not None:
            metrics.step_seconds.observe(now - last)
        if not ended and len(self._last_decision) < 100_000:
            self._last_decision[turn_id] = now

    async def _emit(self, turn_id: str, step: int, message: BaseModel, conversation_id: str) -> None:
        """Publish, then clear the ledger's pending copy off the hot path (a crash before that only republishes)."""
        await self.publish(TOPIC_OF[type(message)], message, conversation_id)
        task = asyncio.create_task(self.ledger.published(turn_id, step))
        self._clearing.add(task)
        task.add_done_callback(self._cleared)

    def _cleared(self, task: asyncio.Task) -> None:
        self._clearing.discard(task)
        if not task.cancelled() and task.exception():
            log.warning("could not clear a published decision: %s", task.exception())

    async def drain(self) -> None:
        """Wait for the pending-copy clean-ups (shutdown, tests)."""
        if self._clearing:
            await asyncio.gather(*self._clearing, return_exceptions=True)

    async def _republish(self, row: TurnRow) -> None:
        """Crash recovery: the decision was recorded but maybe not published."""
        pending = json.loads(row.pending or "null")
        if pending:
            message = MODEL_OF[pending["topic"]].model_validate(pending["message"])
            log.warning("turn %s: republishing the pending %s after a redelivery", row.turn_id, type(message).__name__)
            await self._emit(row.turn_id, row.step, message, row.conversation_id)

    # -- a new turn ---------------------------------------------------------------------
    async def on_start(self, command: StartTurn) -> str:
        turn = command.turn
        call = CallModel(turn=turn, step=0, messages=[{"role": "user", "content": command.text}])
        if await self.ledger.start(turn.model_dump(mode="json"), _pending(call), _traceparent()):
            self._stepped(turn.turn_id, ended=False)
            await self._emit(turn.turn_id, 0, call, turn.conversation_id)
            return "started"
        row = await self.ledger.get(turn.turn_id)
        if row is not None and row.step == 0 and row.pending:
            await self._republish(row)
            return "republished"
        log.info("turn %s: duplicate request %s dropped", turn.turn_id, turn.request_id)
        return "duplicate"

    # -- one iteration ------------------------------------------------------------------
    async def on_iteration(self, event: ModelResponded) -> str:
        """Decide, then record the step with one conditional update; only a refused update reads the ledger."""
        span = trace.get_current_span()
        model = event.model or self.model
        cost = self.prices.cost(model, event.spent)
        step_cost = self.prices.cost(model, event.usage)
        decision = decide(event, self.policy, cost, step_cost)
        span.set_attribute("roundtrip.decision", type(decision).__name__)
        message: BaseModel
        transcript = [*event.messages, {"role": "assistant", "content": event.content}]
        if isinstance(decision, Continue):
            if decision.resume_model:
                message = CallModel(turn=event.turn, step=event.step, messages=transcript, spent=event.spent)
            else:
                message = CheckToolCalls(turn=event.turn, step=event.step, messages=transcript, calls=event.tool_calls,
                                         spent=event.spent, blocked=decision.blocked)
                if decision.blocked:
                    span.add_event("repeat of a failed call blocked", {"roundtrip.blocked": list(decision.blocked)})
            outcome = None
        else:
            message = self._ended(event.turn, event.step, decision, event.spent, cost)
            outcome = decision.outcome.value
            span.set_attributes({"roundtrip.outcome": outcome, "roundtrip.detail": decision.detail})
            if outcome in ERROR_OUTCOMES:
                mark_error(span, f"{outcome}: {decision.detail}", outcome)
            if decision.outcome not in (Outcome.END_TURN,):
                log.warning("turn %s ended at step %d: %s (%s) trace %s", event.turn.turn_id, event.step, outcome,
                            decision.detail, event.turn.trace_id)
        if await self.ledger.advance(event.turn.turn_id, event.step, usage_columns(event.spent), cost, _pending(message),
                                     outcome=outcome, traceparent=_traceparent()):
            # counted once, when the ledger records the step (a redelivery that republishes counts nothing again)
            metrics.count_usage(model, event.usage, step_cost)
            if isinstance(message, CheckToolCalls) and message.blocked:
                metrics.guard_blocked_calls.inc(len(message.blocked))
            if outcome:
                metrics.count_turn_end(outcome, event.step)
            self._stepped(event.turn.turn_id, ended=bool(outcome))
            await self._emit(event.turn.turn_id, event.step, message, event.turn.conversation_id)
            return outcome or type(message).__name__
        return await self._not_advanced(event, span)

    async def _not_advanced(self, event: ModelResponded, span: trace.Span) -> str:
        """Why the ledger refused the step: a redelivery (republish if its decision may be unpublished), a duplicate, a gap."""
        row = await self.ledger.get(event.turn.turn_id)
        if row is None:
            log.warning("turn %s: iteration for a turn the ledger does not know; dropped", event.turn.turn_id)
            return "unknown turn"
        if event.step == row.step and row.pending:
            await self._republish(row)
            return "republished"
        if row.status == ENDED or event.step <= row.step:
            span.add_event("duplicate or late iteration dropped", {"ledger.step": row.step, "ledger.status": row.status})
            return "duplicate"
        log.warning("turn %s: iteration %d arrived after %d; dropped", event.turn.turn_id, event.step, row.step)
        return "out of order"

    @staticmethod
    def _ended(turn: Turn, step: int, decision: Finish, spent: Usage, cost: float) -> TurnEnded:
        return TurnEnded(turn=turn, step=step, outcome=decision.outcome, text=decision.text, spent=spent, cost_usd=round(cost, 6))

    # -- from outside the loop ------------------------------------------------------------
    async def end_from_outside(self, row: TurnRow, outcome: Outcome, detail: str) -> bool:
        """Stuck past its grace, past its deadline, or cancelled: end it politely, once."""
        turn = Turn.model_validate(row.turn)
        ended = TurnEnded(turn=turn, step=row.step, outcome=outcome, text=polite(outcome), spent=spent_of(row), cost_usd=round(row.cost_usd, 6))
        with self._in_turn_trace(row, f"guard.{outcome.value}") as span:
            span.set_attributes({"roundtrip.turn_id": row.turn_id, "roundtrip.outcome": outcome.value, "roundtrip.detail": detail})
            if outcome.value in ERROR_OUTCOMES:
                mark_error(span, f"{outcome.value}: {detail}", outcome.value)
            if not await self.ledger.end(row.turn_id, outcome.value, _pending(ended)):
                return False
            log.warning("turn %s ended from outside the loop: %s (%s) trace %s", row.turn_id, outcome.value, detail, row.trace_id)
            metrics.count_turn_end(outcome, row.step)
            self._last_decision.pop(row.turn_id, None)
            await self._emit(row.turn_id, row.step, ended, row.conversation_id)
            return True

    async def on_cancel(self, command: CancelTurn) -> str:
        row = await self.ledger.get(command.turn_id)
        if row is None:
            return "unknown turn"
        if row.status == ENDED:
            return "already ended"
        return "cancelled" if await self.end_from_outside(row, Outcome.CANCELLED, command.reason) else "already ended"

    async def sweep(self, flag: Callable[[TurnFlagged, str], Awaitable[None]], now: float | None = None) -> tuple[int, int]:
        """Flag turns idle past stuck_after_s; end those past their grace or their deadline."""
        now = now or time.time()
        idle, expired = await self.ledger.overdue(now, self.stuck_after_s, self.stuck_grace_s, self.turn_deadline_s)
        flagged = 0
        for row in idle:
            if not await self.ledger.flag_stuck(row.turn_id, now):
                continue
            flagged += 1
            idle_s = now - row.last_progress_at
            detail = f"no progress for {idle_s:.1f} s after step {row.step}; ending in {self.stuck_grace_s:g} s unless it moves"
            with self._in_turn_trace(row, "guard.turn_stuck") as span:
                span.add_event("turn stuck", {"roundtrip.turn_id": row.turn_id, "roundtrip.idle_s": idle_s, "roundtrip.step": row.step})
                span.set_attribute("roundtrip.detail", detail)
                mark_error(span, f"stuck: {detail}", "stuck")
                log.warning("turn %s is stuck: %s (customer %s, trace %s)", row.turn_id, detail, row.customer_id, row.trace_id)
                await flag(TurnFlagged(turn=Turn.model_validate(row.turn), step=row.step, idle_s=round(idle_s, 3), detail=detail), row.conversation_id)
        ended = 0
        for row in expired:
            over_deadline = row.started_at < now - self.turn_deadline_s
            detail = f"turn older than {self.turn_deadline_s:g} s" if over_deadline else f"stuck for more than {self.stuck_grace_s:g} s"
            ended += await self.end_from_outside(row, Outcome.DEADLINE, detail)
        return flagged, ended

    @staticmethod
    def _in_turn_trace(row: TurnRow, name: str):
        """A span in the turn's own trace (under the turn span, linked to its last recorded hop), so Jaeger shows it with the turn."""
        return span_in_turn(name, Turn.model_validate(row.turn), row.traceparent, row.step)
