"""Guard handlers: every turn starts here, every iteration passes here, stuck turns end here.

Each handler decides, records the decision in the ledger with a conditional update
(so a duplicate or a racing replica is recognised and dropped), then publishes exactly
one next message: CallModel, CheckToolCalls or TurnEnded.

Conversations (services/guard/conversations.py): a turn starts only for the customer who owns
its conversation (anyone else gets a refusal and sees nothing), only once the conversation's
previous turn has ended (a second request waits for it: the starts consumer holds it, other
conversations go on), and with the conversation's history at the head of its transcript. When
a turn ends, its exchange is stored before the end is recorded, so the next turn sees it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiokafka.errors import KafkaError
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from pydantic import BaseModel

from services.guard.conversations import Conversations
from services.guard.ledger import (
    AWAITING,
    ENDED,
    ENDING,
    PENDING,
    STUCK,
    ApprovalRow,
    Ledger,
    TurnRow,
)
from services.guard.pricing import PriceTable
from services.guard.replies import polite
from services.guard.rules import Continue, Finish, Policy, decide
from services.kernel import metrics, topics
from services.kernel.approvals import ApprovalError, DecisionSigner, in_tool_use_order
from services.kernel.events import (
    ApprovalDecided,
    ApprovalRequested,
    CallModel,
    CancelTurn,
    CheckToolCalls,
    Decision,
    ModelResponded,
    Outcome,
    StartTurn,
    ToolCall,
    Turn,
    TurnEnded,
    TurnFlagged,
    Usage,
)
from services.kernel.fingerprints import fingerprint
from services.kernel.telemetry import ERROR_OUTCOMES, mark_error, span_in_turn, tracer

log = logging.getLogger("roundtrip.guard")
security = logging.getLogger("roundtrip.security")

Publish = Callable[[str, BaseModel, str], Awaitable[None]]  # (logical topic, message, conversation id)
TOPIC_OF = {CallModel: topics.MODEL_CALLS, CheckToolCalls: topics.TOOL_CALLS, TurnEnded: topics.OUTCOMES}
MODEL_OF = {topic: model for model, topic in TOPIC_OF.items()}
SWEEP_PUBLISH_TIMEOUT_S = 1.0  # a sweeper publish taking longer means the broker is away (a healthy one acks in ms)
CLEAR_BATCH_S = 0.05  # published decisions are cleared from the outbox together, this often


def _pending(message: BaseModel) -> str:
    """The outbox copy of a decision: {"topic": ..., "message": ...} (pydantic writes the message's JSON itself)."""
    return f'{{"topic": {json.dumps(TOPIC_OF[type(message)])}, "message": {message.model_dump_json()}}}'


class DecisionRefused(Exception):
    """A decision that must do nothing: forged, for another call, for a turn that has ended, or contradicting one made.
    Raised in the handler, so the kernel dead-letters it with this reason."""


def _traceparent() -> str | None:
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")


def usage_columns(usage: Usage) -> dict[str, int]:
    return usage.model_dump()


def spent_of(row: TurnRow) -> Usage:
    return Usage(input_tokens=row.input_tokens, output_tokens=row.output_tokens,
                 cache_creation_input_tokens=row.cache_creation_input_tokens, cache_read_input_tokens=row.cache_read_input_tokens)


class Bounded:
    """The sweeper's publishes, each bounded by SWEEP_PUBLISH_TIMEOUT_S. The first that does not get through means the
    broker is away: `reachable` turns false, and the rest of the sweep only records (ends stay pending in the ledger;
    the outbox publishes them once the broker is back), so a sweep never waits on Kafka's retries."""

    def __init__(self, timeout: float = SWEEP_PUBLISH_TIMEOUT_S) -> None:
        self.timeout, self.reachable = timeout, True

    async def __call__(self, work: Callable[[], Awaitable[Any]], what: str) -> Any:
        try:
            return await asyncio.wait_for(work(), self.timeout)
        except (TimeoutError, KafkaError) as exc:
            self.reachable = False
            log.warning("sweep: %s not published (%s); recording the rest, the outbox publishes them later", what, type(exc).__name__)
            return None


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
    outbox_after_s: float = 5.0  # the sweeper republishes a decision still unpublished after this long
    conversations: Conversations | None = None  # None: every request stands alone (unit tests of the loop)
    wait_poll_s: float = 0.5  # a start waiting for its conversation's running turn looks again this often
    decisions: DecisionSigner | None = None  # verifies people's approval decisions (None: every decision is refused)

    def __post_init__(self) -> None:
        self._clearing: asyncio.Task | None = None
        self._to_clear: list[tuple[str, str]] = []
        self._last_decision: dict[str, float] = {}  # turn id -> monotonic time of its last decision (step latency)
        self._turn_ended: dict[str, asyncio.Event] = {}  # conversation id -> set when this replica ends one of its turns

    def _stepped(self, turn_id: str, ended: bool) -> None:
        """Observe one round trip of the loop: from this turn's previous decision (on this replica) to this one."""
        now = time.monotonic()
        if (last := self._last_decision.pop(turn_id, None)) is not None:
            metrics.step_seconds.observe(now - last)
        if not ended and len(self._last_decision) < 100_000:
            self._last_decision[turn_id] = now

    async def _emit(self, turn_id: str, pending: str, message: BaseModel, conversation_id: str) -> None:
        """Publish, then clear the ledger's pending copy off the hot path (a crash before that only republishes).

        Clears are batched: one transaction for all the decisions published meanwhile (under load,
        one write instead of one per step)."""
        await self.publish(TOPIC_OF[type(message)], message, conversation_id)
        if isinstance(message, TurnEnded) and (ended := self._turn_ended.get(conversation_id)) is not None:
            ended.set()  # a start of the same conversation waits for this
        self._to_clear.append((turn_id, pending))
        if self._clearing is None or self._clearing.done():
            self._clearing = asyncio.create_task(self._clear())

    async def _clear(self) -> None:
        await asyncio.sleep(CLEAR_BATCH_S)
        while self._to_clear:
            batch, self._to_clear = self._to_clear, []
            try:
                await self.ledger.published_many(batch)
            except Exception as exc:  # noqa: BLE001 - only means a republish later (the sweeper's outbox)
                log.warning("could not clear %d published decisions: %s", len(batch), exc)

    async def drain(self) -> None:
        """Wait for the pending-copy clean-ups (shutdown, tests)."""
        if self._clearing is not None:
            await asyncio.gather(self._clearing, return_exceptions=True)

    async def _republish(self, row: TurnRow, why: str = "a redelivery") -> None:
        """Crash recovery: the decision was recorded but maybe not published."""
        pending = json.loads(row.pending or "null")
        if pending:
            message = MODEL_OF[pending["topic"]].model_validate(pending["message"])
            log.warning("turn %s: republishing the pending %s after %s", row.turn_id, type(message).__name__, why)
            await self._emit(row.turn_id, row.pending, message, row.conversation_id)

    async def republish_outbox(self, older_than: float | None = None, timeout: float = SWEEP_PUBLISH_TIMEOUT_S) -> int:
        """Publish every recorded decision still not published (at start-up, and from the sweeper).

        Each publish is bounded by `timeout`: one that does not get through means the broker is away, and the pass
        stops there (the rows stay pending for the next one) instead of waiting for the producer's retries."""
        older_than = time.time() - self.outbox_after_s if older_than is None else older_than
        count = 0
        for row in await self.ledger.outbox(older_than):
            try:
                await asyncio.wait_for(self._republish(row, "a restart or a failed publish"), timeout)
                count += 1
            except (TimeoutError, KafkaError) as exc:
                log.warning("outbox: the pending decision of turn %s not published (%s); the broker looks away, "
                            "the rest waits for the next pass", row.turn_id, type(exc).__name__)
                break
            except Exception:  # noqa: BLE001 - the rest of the outbox still goes out; this row stays pending
                log.exception("turn %s: republishing its pending decision failed; will retry", row.turn_id)
        return count

    # -- a new turn ---------------------------------------------------------------------
    async def on_start(self, command: StartTurn) -> str:
        turn = command.turn
        if (row := await self.ledger.get(turn.turn_id)) is not None:
            return await self._started_before(row)
        history: list[dict] = []
        if self.conversations is not None:
            owner = await self.conversations.claim(turn.conversation_id, turn.customer_id)
            if owner != turn.customer_id:
                return await self._refuse(turn)
            await self._wait_for_earlier_turns(turn)
            history = await self.conversations.history(turn.conversation_id)
            await self.conversations.open_turn(turn.conversation_id, turn.turn_id, command.text)
        now = time.time()
        changes: dict[str, float | int] = {"history_messages": len(history)}
        if not turn.deadline_at:  # the turn's deadline travels with it: the gate signs it into every approval
            changes["deadline_at"] = round(now + self.turn_deadline_s, 3)
        turn = turn.model_copy(update=changes)
        call = CallModel(turn=turn, step=0, messages=[*history, {"role": "user", "content": command.text}])
        if history:
            trace.get_current_span().set_attribute("roundtrip.history_messages", len(history))
        pending = _pending(call)
        if await self.ledger.start(turn.model_dump(mode="json"), pending, _traceparent(), now=now, deadline_at=turn.deadline_at):
            self._stepped(turn.turn_id, ended=False)
            await self._emit(turn.turn_id, pending, call, turn.conversation_id)
            return "started"
        row = await self.ledger.get(turn.turn_id)
        return await self._started_before(row) if row is not None else "duplicate"

    async def _started_before(self, row: TurnRow) -> str:
        """A start the ledger has seen: republish its first decision if that may not be out, else drop it."""
        if row.step == 0 and row.pending:
            await self._republish(row)
            return "republished"
        log.info("turn %s: duplicate request %s dropped", row.turn_id, row.request_id)
        return "duplicate"

    async def _refuse(self, turn: Turn) -> str:
        """A request naming another customer's conversation: a polite refusal, no history, no model call."""
        now = time.time()
        outcome = Outcome.CONVERSATION_REFUSED
        ended = TurnEnded(turn=turn, step=0, outcome=outcome, text=polite(outcome))
        pending = _pending(ended)
        if not await self.ledger.start(turn.model_dump(mode="json"), pending, _traceparent(), now=now, outcome=outcome.value):
            row = await self.ledger.get(turn.turn_id)
            return await self._started_before(row) if row is not None else "duplicate"
        security.warning("turn %s refused: customer %s named conversation %s of another customer (request %s)",
                         turn.turn_id, turn.customer_id, turn.conversation_id, turn.request_id)
        trace.get_current_span().add_event("conversation refused: it belongs to another customer")
        metrics.count_turn_end(outcome.value, 0)
        await self._emit(turn.turn_id, pending, ended, turn.conversation_id)
        return "refused"

    async def _wait_for_earlier_turns(self, turn: Turn) -> float:
        """Block this start until no other turn of its conversation is live (turns of one conversation run one
        after another). Woken at once when this replica ends that turn, else it looks again every wait_poll_s;
        gives up (and starts anyway) past the longest a turn can live. Returns the seconds waited."""
        started = time.monotonic()
        give_up = started + self.turn_deadline_s + self.stuck_grace_s + 60
        conversation = turn.conversation_id
        announced = False
        while True:
            ended = self._turn_ended.setdefault(conversation, asyncio.Event())  # before the read: no lost wake-up
            live = await self.ledger.live_turns(conversation, but=turn.turn_id)
            if not live:
                break
            if not announced:
                announced = True
                log.info("turn %s waits for turn %s of conversation %s to end", turn.turn_id, live[0].turn_id, conversation)
                trace.get_current_span().add_event("waiting for the conversation's running turn", {"roundtrip.waits_for": live[0].turn_id})
            if time.monotonic() > give_up:
                log.warning("turn %s: turn %s of its conversation is still not ended; starting anyway", turn.turn_id, live[0].turn_id)
                break
            try:
                await asyncio.wait_for(ended.wait(), self.wait_poll_s)
            except TimeoutError:
                pass
            self._turn_ended.pop(conversation, None)
        self._turn_ended.pop(conversation, None)
        waited = time.monotonic() - started
        if announced:
            trace.get_current_span().set_attribute("roundtrip.conversation_wait_s", round(waited, 3))
        return waited

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
            if self.conversations is not None:  # stored before the end is recorded: the next turn waits for the end
                await self.conversations.close_turn(event.turn.conversation_id, event.turn.turn_id,
                                                    event.messages[event.turn.history_messages:], event.content, message.text, outcome)
            if decision.outcome not in (Outcome.END_TURN,):
                log.warning("turn %s ended at step %d: %s (%s) trace %s", event.turn.turn_id, event.step, outcome,
                            decision.detail, event.turn.trace_id)
        pending = _pending(message)
        if await self.ledger.advance(event.turn.turn_id, event.step, usage_columns(event.spent), cost, pending,
                                     outcome=outcome, traceparent=_traceparent()):
            # counted once, when the ledger records the step (a redelivery that republishes counts nothing again)
            metrics.count_usage(model, event.usage, step_cost)
            if isinstance(message, CheckToolCalls) and message.blocked:
                metrics.guard_blocked_calls.inc(len(message.blocked))
            if outcome:
                metrics.count_turn_end(outcome, event.step)
            self._stepped(event.turn.turn_id, ended=bool(outcome))
            await self._emit(event.turn.turn_id, pending, message, event.turn.conversation_id)
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
    async def end_from_outside(self, row: TurnRow, outcome: Outcome, detail: str, announce: bool = True, **seen) -> str | None:
        """Stuck past its grace, past its deadline, or cancelled: end it politely, once.

        Conditional on the state it was decided from (`row.step`, and whatever `seen` adds), so
        a turn that moved meanwhile is not ended. While an executor holds a lease on the turn
        (its calls are running), the turn becomes ENDING: nothing can claim it any more, and the
        end is recorded and published once the lease is released (`sweep`). Returns ENDED,
        ENDING, or None (the turn was not in the state decided from)."""
        turn = Turn.model_validate(row.turn)
        ended = TurnEnded(turn=turn, step=row.step, outcome=outcome, text=polite(outcome), spent=spent_of(row), cost_usd=round(row.cost_usd, 6))
        pending = _pending(ended)
        with self._in_turn_trace(row, f"guard.{outcome.value}") as span:
            span.set_attributes({"roundtrip.turn_id": row.turn_id, "roundtrip.outcome": outcome.value, "roundtrip.detail": detail})
            if outcome.value in ERROR_OUTCOMES:
                mark_error(span, f"{outcome.value}: {detail}", outcome.value)
            if self.conversations is not None:  # the customer's words and this reply (a fuller end later replaces it)
                await self.conversations.close_turn_with_reply(row.conversation_id, row.turn_id, ended.text, outcome.value)
            result = await self.ledger.end(row.turn_id, outcome.value, pending, step=row.step, now=time.time(), defer=True, **seen)
            if result is None:
                span.add_event("not ended: the turn moved since the decision", {"roundtrip.step": row.step})
                return None
            if result == ENDING:
                span.add_event("end deferred: an executor is running this step's calls", {"roundtrip.step": row.step})
                log.warning("turn %s: %s decided (%s); waiting for the running step %d to finish", row.turn_id, outcome.value, detail, row.step)
                return ENDING
            log.warning("turn %s ended from outside the loop: %s (%s) trace %s", row.turn_id, outcome.value, detail, row.trace_id)
            metrics.count_turn_end(outcome, row.step)
            self._last_decision.pop(row.turn_id, None)
            if announce:  # else (the broker is away) the ledger keeps it pending: the outbox publishes it later
                await self._emit(row.turn_id, pending, ended, row.conversation_id)
            return ENDED

    async def on_cancel(self, command: CancelTurn) -> str:
        for _ in range(10):  # re-read and retry while the turn keeps moving under the cancel
            row = await self.ledger.get(command.turn_id)
            if row is None:
                return "unknown turn"
            if row.status in (ENDED, ENDING):
                return "already ended"
            result = await self.end_from_outside(row, Outcome.CANCELLED, command.reason)
            if result is not None and row.status == AWAITING:
                await self.ledger.close_approvals(row.turn_id, "ended")
            if result == ENDED:
                return "cancelled"
            if result == ENDING:
                return "cancelling"
        log.warning("turn %s: cancel gave up: the turn kept moving", command.turn_id)
        return "not cancelled"

    # -- a call waits for a person --------------------------------------------------------
    async def on_approval_requested(self, event: ApprovalRequested) -> str:
        """Record the turn as AWAITING (no thread waits: the decision or the deadline moves it on)."""
        span = trace.get_current_span()
        span.set_attributes({"roundtrip.approval_id": event.approval_id, "roundtrip.tool": event.call.name})
        approval = dict(
            approval_id=event.approval_id, turn_id=event.turn.turn_id, step=event.step, tool_use_id=event.call.id,
            tool=event.call.name, input_sha256=event.input_sha256, customer_id=event.turn.customer_id,
            conversation_id=event.turn.conversation_id, reason=event.reason, requested_at=event.requested_at,
            expires_at=event.expires_at, traceparent=_traceparent(), request_json=event.model_dump_json(),
        )
        if await self.ledger.await_approval(approval):
            self._last_decision.pop(event.turn.turn_id, None)  # the wait is not a step of the loop
            log.info("turn %s step %d awaits approval %s of %s(%s): %s", event.turn.turn_id, event.step, event.approval_id,
                     event.call.name, _shown(event.call.input), event.reason)
            return "awaiting"
        row = await self.ledger.get(event.turn.turn_id)
        if row is not None and row.status == ENDING and row.step == event.step:
            await self.ledger.release_ending_lease(row.turn_id, row.step)  # the step's calls are done: the end may go
        known = await self.ledger.approval(event.approval_id)
        if known is not None:
            return "duplicate"
        log.warning("turn %s: approval %s not recorded: the turn has ended or moved on (%s)", event.turn.turn_id,
                    event.approval_id, row.status if row else "unknown turn")
        return "not awaiting"

    async def on_decision(self, decision: ApprovalDecided) -> str:
        """Resume the waiting step: approved -> the gate checks the call again and signs it; denied -> the model
        gets an is_error tool_result with the reason. Anything that must not act raises DecisionRefused."""
        span = trace.get_current_span()
        span.set_attributes({"roundtrip.approval_id": decision.approval_id, "roundtrip.decision": decision.decision.value,
                             "roundtrip.decided_by": decision.decided_by})
        try:
            if self.decisions is None:
                raise ApprovalError("this guard has no decision keys")
            self.decisions.verify(decision)
        except ApprovalError as exc:
            security.error("refused decision %s for turn %s by %r: %s", decision.approval_id, decision.turn_id, decision.decided_by, exc)
            raise DecisionRefused(f"forged decision: {exc}") from None
        approval = await self.ledger.approval(decision.approval_id)
        if approval is None:
            raise DecisionRefused(f"no approval {decision.approval_id} was requested")
        if (decision.turn_id, decision.tool_use_id, decision.input_sha256) != (approval.turn_id, approval.tool_use_id, approval.input_sha256):
            security.error("decision %s names another call than the one requested (turn %s, call %s)", decision.approval_id,
                           decision.turn_id, decision.tool_use_id)
            raise DecisionRefused("decision for another call: its turn, tool_use id or arguments differ from the approval requested")
        status = "approved" if decision.decision is Decision.APPROVE else "denied"
        if approval.status != PENDING:
            if approval.status == status:  # the same decision again (redelivered, or published twice): nothing runs twice
                span.add_event("duplicate decision dropped", {"roundtrip.decided_by": approval.decided_by or ""})
                log.info("approval %s: already %s by %s; duplicate dropped", approval.approval_id, status, approval.decided_by)
                return "duplicate"
            raise DecisionRefused(f"approval {approval.approval_id} was already {approval.status}"
                                  + (f" by {approval.decided_by}" if approval.decided_by else ""))
        row = await self.ledger.get(approval.turn_id)
        if row is None or row.status != AWAITING or row.step != approval.step:
            raise DecisionRefused(f"the turn {approval.turn_id} has ended or no longer waits for this approval"
                                  + (f" ({row.status}{', ' + row.outcome if row.outcome else ''})" if row else ""))
        now = time.time()
        if now >= approval.expires_at:
            raise DecisionRefused(f"the approval deadline passed {now - approval.expires_at:.1f} s ago; the turn ends without the call")
        request = ApprovalRequested.model_validate_json(approval.request_json)
        turn = request.turn
        if turn.deadline_at:  # the time spent waiting does not count against the turn's own deadline
            turn = turn.model_copy(update={"deadline_at": round(turn.deadline_at + (now - request.requested_at), 3)})
        message: BaseModel
        if status == "approved":
            call = ToolCall(id=request.call.id, name=request.call.name, input=request.call.input,
                            fingerprint=fingerprint(request.call.name, request.call.input))
            message = CheckToolCalls(turn=turn, step=request.step, messages=request.messages, calls=[call], spent=request.spent,
                                     results=request.results, decisions=[decision])
        else:
            denied = {"type": "tool_result", "tool_use_id": request.call.id, "is_error": True, "content": (
                "Not run: a member of staff reviewed this call and declined it"
                + (f": {decision.reason}" if decision.reason else "") + ". Nothing was changed. Explain this to the customer "
                "and do not make this call again.")}
            content = in_tool_use_order(request.messages, [*request.results, denied])
            message = CallModel(turn=turn, step=request.step, messages=[*request.messages, {"role": "user", "content": content}],
                                spent=request.spent)
        with self._waited(approval, status, now, decision.decided_by, decision.reason):
            pending = _pending(message)
            if not await self.ledger.decide(approval.approval_id, status, decision.decided_by, decision.decided_at,
                                            decision.reason, pending, turn.deadline_at or None, now=now):
                raise DecisionRefused(f"the turn {approval.turn_id} ended or the approval was decided while this decision was processed")
            log.info("turn %s: %s(%s) %s by %s (approval %s, waited %.1f s)", approval.turn_id, approval.tool,
                     _shown(request.call.input), status, decision.decided_by, approval.approval_id, now - approval.requested_at)
            self._stepped(approval.turn_id, ended=False)
            await self._emit(approval.turn_id, pending, message, approval.conversation_id)
        return status

    def _waited(self, approval: ApprovalRow, status: str, now: float, decided_by: str = "", reason: str = ""):
        """The wait as ONE span in the turn's trace: from the request to the decision (or the deadline); what follows is its child."""
        parent = extract({"traceparent": approval.traceparent}) if approval.traceparent else otel_context.get_current()
        span = tracer().start_span("approval.wait", context=parent, start_time=int(approval.requested_at * 1e9))
        span.set_attributes({
            "roundtrip.turn_id": approval.turn_id, "roundtrip.approval_id": approval.approval_id, "roundtrip.tool": approval.tool,
            "roundtrip.tool_use_id": approval.tool_use_id, "roundtrip.decision": status, "roundtrip.decided_by": decided_by,
            "roundtrip.decided_at": now, "roundtrip.waited_s": round(now - approval.requested_at, 3), "roundtrip.reason": reason[:200],
        })
        if status not in ("approved",):
            span.set_status(trace.Status(trace.StatusCode.ERROR, status))
        return _EndAt(span, int(now * 1e9))

    async def expire_approvals(self, now: float, announced: Bounded | None = None) -> int:
        """Approvals nobody decided in time: the turn ends politely (approval_timeout), the call never runs."""
        announced = announced or Bounded()
        ended = 0
        for approval, row in await self.ledger.overdue_approvals(now):
            with self._waited(approval, "expired", now):
                result = await announced(
                    lambda: self.end_from_outside(row, Outcome.APPROVAL_TIMEOUT, f"{approval.tool} not decided within its "
                                                  "approval deadline", announce=announced.reachable, status=AWAITING),
                    f"the end of {row.turn_id}")
            if result is not None:
                await self.ledger.close_approvals(row.turn_id, "expired", now)
                ended += result == ENDED
        return ended

    async def finish_ending(self, row: TurnRow, announced: Bounded | None = None) -> bool:
        """An end that waited for a running step: record it and publish it once the lease is gone (when the broker is
        away, the ledger keeps it pending and the outbox publishes it later)."""
        announced = announced or Bounded()
        if not await self.ledger.finish_ending(row.turn_id, time.time()):
            return False
        done = await self.ledger.get(row.turn_id)
        if done is not None and done.pending and announced.reachable:
            await announced(lambda: self._republish(done, "the running step finished"), f"the end of {row.turn_id}")
        return True

    async def sweep(self, flag: Callable[[TurnFlagged, str], Awaitable[None]], now: float | None = None) -> tuple[int, int]:
        """Flag turns idle past stuck_after_s; end those past their grace or their deadline; finish deferred ends;
        republish decisions left unpublished. Every change is conditional on the row as read, with the current time."""
        now = now or time.time()
        idle, expired, ending = await self.ledger.overdue(now, self.stuck_after_s, self.stuck_grace_s, self.turn_deadline_s)
        announced = Bounded()  # every publish of this sweep, bounded: the sweep never waits on Kafka
        flagged = 0
        for row in idle:
            at = max(now, time.time())  # never a stale timestamp: it would shorten the grace
            if not await self.ledger.flag_stuck(row.turn_id, at, self.stuck_after_s, step=row.step):
                continue
            flagged += 1
            idle_s = at - row.last_progress_at
            detail = f"no progress for {idle_s:.1f} s after step {row.step}; ending in {self.stuck_grace_s:g} s unless it moves"
            with self._in_turn_trace(row, "guard.turn_stuck") as span:
                span.add_event("turn stuck", {"roundtrip.turn_id": row.turn_id, "roundtrip.idle_s": idle_s, "roundtrip.step": row.step})
                span.set_attribute("roundtrip.detail", detail)
                mark_error(span, f"stuck: {detail}", "stuck")
                log.warning("turn %s is stuck: %s (customer %s, trace %s)", row.turn_id, detail, row.customer_id, row.trace_id)
                if announced.reachable:
                    message = TurnFlagged(turn=Turn.model_validate(row.turn), step=row.step, idle_s=round(idle_s, 3), detail=detail)
                    await announced(lambda: flag(message, row.conversation_id), f"the stuck flag of {row.turn_id}")
        ended = 0
        for row in expired:
            deadline_at = row.deadline_at or row.started_at + self.turn_deadline_s
            if deadline_at <= now:
                ending_it = partial(self.end_from_outside, row, Outcome.DEADLINE, f"turn older than {self.turn_deadline_s:g} s",
                                    announce=announced.reachable)
            else:  # stuck past its grace: only if still stuck since that very flag
                ending_it = partial(self.end_from_outside, row, Outcome.DEADLINE, f"stuck for more than {self.stuck_grace_s:g} s",
                                    announce=announced.reachable, status=STUCK, flagged_at=row.flagged_at)
            result = await announced(ending_it, f"the end of {row.turn_id}")
            ended += result == ENDED
        for row in ending:
            ended += await self.finish_ending(row, announced)
        ended += await self.expire_approvals(now, announced)
        if announced.reachable:
            await self.republish_outbox()
        return flagged, ended

    @staticmethod
    def _in_turn_trace(row: TurnRow, name: str):
        """A span in the turn's own trace (under the turn span, linked to its last recorded hop), so Jaeger shows it with the turn."""
        return span_in_turn(name, Turn.model_validate(row.turn), row.traceparent, row.step)


class _EndAt:
    """Makes `span` current for the block and ends it at a given time (the decision's)."""

    def __init__(self, span: trace.Span, end_ns: int) -> None:
        self.span, self.end_ns = span, end_ns

    def __enter__(self) -> trace.Span:
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, *exc) -> None:
        otel_context.detach(self._token)
        self.span.end(end_time=self.end_ns)


def _shown(tool_input: object, limit: int = 80) -> str:
    text = json.dumps(tool_input, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
