"""Approvals: a call that waits for a person (turn.approval_requests), and a person's signed decision on it.

No thread waits: a request records the turn as AWAITING, and the decision or the deadline moves it on. An approved
call goes back to the gate, which checks it again and signs it; a denied one becomes an is_error tool_result. A
decision that must not act raises DecisionRefused (dead-lettered with the reason); the same decision again runs
nothing twice.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from dataclasses import dataclass

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract

from roundtrip._guard.external_ends import ExternalEnds
from roundtrip._guard.ledger import AWAITING, ENDED, ENDING, PENDING, ApprovalRow, Ledger
from roundtrip._guard.loop import StepClock
from roundtrip._guard.outbox import Bounded, Outbox, pending_copy, traceparent
from roundtrip._kernel.observability.telemetry import tracer
from roundtrip._kernel.storage.turnstore import LIVE, disagreement, refused
from roundtrip._kernel.wire.approvals import ApprovalError, DecisionVerifier, Verifier, in_tool_use_order
from roundtrip._kernel.wire.events import (
    ApprovalDecided,
    ApprovalRequested,
    CallModel,
    CheckToolCalls,
    Decision,
    Outcome,
    SupportStatus,
    ToolCall,
    Turn,
    TurnState,
)
from roundtrip._kernel.wire.fingerprints import fingerprint

log = logging.getLogger("roundtrip.guard")
security = logging.getLogger("roundtrip.security")


MAX_WAIT_FOR_REQUEST_S = 120.0  # a decision whose request is not recorded yet waits for it this long at most
DEADLINE_SLACK_S = 0.001  # the ledger's deadline and the request's, both rounded to the millisecond


class DecisionRefused(Exception):
    """A decision that must do nothing: forged, for another call, for an ended turn, or contradicting one made."""


class RequestRefused(Exception):
    """An approval request the gate did not sign as it reads (forged, edited, for another customer)."""


@dataclass
class Approvals:
    ledger: Ledger
    outbox: Outbox
    external_ends: ExternalEnds
    decisions: DecisionVerifier  # verifies people's approval decisions
    steps: StepClock
    holds: Verifier  # the gate's public keys: its signature of each hold

    async def on_requested(self, event: ApprovalRequested) -> str:
        span = trace.get_current_span()
        span.set_attributes({"roundtrip.approval_id": event.approval_id, "roundtrip.tool": event.call.name})
        self._check_hold(event)
        await self._not_held_before(event)
        approval = dict(
            approval_id=event.approval_id,
            turn_id=event.turn.turn_id,
            step=event.step,
            tool_use_id=event.call.id,
            tool=event.call.name,
            input_sha256=event.input_sha256,
            customer_id=event.turn.customer_id,
            conversation_id=event.turn.conversation_id,
            reason=event.reason,
            requested_at=round(time.time(), 3),  # the guard's clock: the wait it adds to the deadline is measured here
            expires_at=event.expires_at,
            traceparent=traceparent(),
            request_json=event.model_dump_json(),
        )
        status = waiting_status(event)
        pending = pending_copy(status)
        if await self.ledger.await_approval(approval, pending=pending):
            self.steps.forget(event.turn.turn_id)
            log.info(
                "turn %s step %d awaits approval %s of %s(%s): %s",
                event.turn.turn_id,
                event.step,
                event.approval_id,
                event.call.name,
                _shown(event.call.input),
                event.reason,
            )
            await self.outbox.emit(event.turn.turn_id, pending, status, event.turn.conversation_id)
            return "awaiting"
        row = await self.ledger.get(event.turn.turn_id)
        if row is not None and (why := disagreement(event.turn, row)) is not None:
            raise refused(event.turn, "guard", why)  # dead-lettered: it may not hold another customer's turn
        if row is not None and row.status == ENDING and row.step == event.step:
            await self.ledger.release_ending_lease(row.turn_id, row.step)  # the step's calls are done: the end may go
        known = await self.ledger.approval(event.approval_id)
        if known is not None:
            return "duplicate"
        log.warning(
            "turn %s: approval %s not recorded: the turn has ended or moved on (%s)",
            event.turn.turn_id,
            event.approval_id,
            row.status if row else "unknown turn",
        )
        return "not awaiting"

    def _check_hold(self, event: ApprovalRequested) -> None:
        """Only a wait the gate signed, word for word, is recorded: anything else is refused on roundtrip.security."""
        try:
            self.holds.verify_hold(event)
        except ApprovalError as exc:
            raise self._refused(event, str(exc)) from None

    async def _not_held_before(self, event: ApprovalRequested) -> None:
        """A call held (or decided) once is never held again under another approval id, and a wait keeps the deadline
        the ledger gave its turn: the one a decision extends is the request's, so the two must be the same."""
        earlier = await self.ledger.list_approvals(status=None, turn_id=event.turn.turn_id, limit=1000)
        if any(a.approval_id == event.approval_id for a in earlier):
            return  # this very request again: recorded once, below
        if held := next((a for a in earlier if a.tool_use_id == event.call.id), None):
            raise self._refused(event, f"its call was held already, as approval {held.approval_id} ({held.status})")
        row = await self.ledger.get(event.turn.turn_id)
        if row is None or row.status not in LIVE or row.step != event.step:
            return  # not recorded below either: the turn ended, or moved on
        if abs((row.deadline_at or 0.0) - event.turn.deadline_at) > DEADLINE_SLACK_S:
            raise self._refused(event, "its turn's deadline is not the one the ledger keeps for the turn")

    @staticmethod
    def _refused(event: ApprovalRequested, why: str) -> RequestRefused:
        security.error(
            "refused approval request %r for turn %r (customer %r): %s",
            event.approval_id,
            event.turn.turn_id,
            event.turn.customer_id,
            why,
        )
        return RequestRefused(why)

    async def on_decision(self, decision: ApprovalDecided) -> str:
        """Resume the waiting step; anything that must not act raises DecisionRefused."""
        span = trace.get_current_span()
        span.set_attributes(
            {
                "roundtrip.approval_id": decision.approval_id,
                "roundtrip.decision": decision.decision.value,
                "roundtrip.decided_by": decision.decided_by,
            }
        )
        approval = await self._requested(decision)
        status = "approved" if decision.decision is Decision.APPROVE else "denied"
        if approval.status != PENDING:
            # the same decision again (redelivered, or published twice): nothing runs twice
            if approval.status == status:
                span.add_event("duplicate decision dropped", {"roundtrip.decided_by": approval.decided_by or ""})
                log.info(
                    "approval %s: already %s by %s; duplicate dropped",
                    approval.approval_id,
                    status,
                    approval.decided_by,
                )
                return "duplicate"
            raise DecisionRefused(
                f"approval {approval.approval_id} was already {approval.status}"
                + (f" by {approval.decided_by}" if approval.decided_by else "")
            )
        now = await self._still_waiting(approval)
        request = ApprovalRequested.model_validate_json(approval.request_json)
        message = resumed(request, decision, status == "approved", now, since=approval.requested_at)
        with self._waited(approval, status, now, decision.decided_by, decision.reason):
            pending = pending_copy(message)
            if not await self.ledger.decide(
                approval.approval_id,
                status,
                decision.decided_by,
                decision.decided_at,
                decision.reason,
                pending,
                message.turn.deadline_at or None,
                now=now,
            ):
                raise DecisionRefused(
                    f"the turn {approval.turn_id} ended or the approval was decided while this decision was processed"
                )
            log.info(
                "turn %s: %s(%s) %s by %s (approval %s, waited %.1f s)",
                approval.turn_id,
                approval.tool,
                _shown(request.call.input),
                status,
                decision.decided_by,
                approval.approval_id,
                now - approval.requested_at,
            )
            self.steps.stepped(approval.turn_id, ended=False)
            await self.outbox.emit(approval.turn_id, pending, message, approval.conversation_id)
        return status

    async def _requested(self, decision: ApprovalDecided) -> ApprovalRow:
        try:
            self.decisions.verify(decision)
        except ApprovalError as exc:
            security.error(
                "refused decision %r for turn %r by %r: %s",
                decision.approval_id,
                decision.turn_id,
                decision.decided_by,
                exc,
            )
            raise DecisionRefused(f"forged decision: {exc}") from None
        approval = await self._recorded(decision)
        if approval is None:
            raise DecisionRefused(f"no approval {decision.approval_id} was requested")
        if (decision.turn_id, decision.tool_use_id, decision.input_sha256) != (
            approval.turn_id,
            approval.tool_use_id,
            approval.input_sha256,
        ):
            security.error(
                "decision %r names another call than the one requested (turn %r, call %r)",
                decision.approval_id,
                decision.turn_id,
                decision.tool_use_id,
            )
            raise DecisionRefused(
                "decision for another call: its turn, tool_use id or arguments differ from the approval requested"
            )
        return approval

    async def _recorded(self, decision: ApprovalDecided) -> ApprovalRow | None:
        """The approval of a verified decision, waited for while its turn is open: it may overtake its request."""
        pause, waited = 0.1, 0.0
        while (approval := await self.ledger.approval(decision.approval_id)) is None:
            row = await self.ledger.get(decision.turn_id)
            if row is None or row.status == ENDED or waited >= MAX_WAIT_FOR_REQUEST_S:
                return None
            if row.deadline_at is not None and time.time() >= row.deadline_at:
                return None
            await asyncio.sleep(pause)
            waited, pause = waited + pause, min(pause * 2, 2.0)
        return approval

    async def _still_waiting(self, approval: ApprovalRow) -> float:
        row = await self.ledger.get(approval.turn_id)
        if row is None or row.status != AWAITING or row.step != approval.step:
            raise DecisionRefused(
                f"the turn {approval.turn_id} has ended or no longer waits for this approval"
                + (f" ({row.status}{', ' + row.outcome if row.outcome else ''})" if row else "")
            )
        now = time.time()
        if now >= approval.expires_at:
            raise DecisionRefused(
                f"the approval deadline passed {now - approval.expires_at:.1f} s ago; the turn ends without the call"
            )
        return now

    async def expire(self, now: float, announced: Bounded | None = None) -> int:
        """Approvals nobody decided in time: the turn ends politely (approval_timeout), the call never runs."""
        announced = announced or Bounded()
        ended = 0
        for approval, row in await self.ledger.overdue_approvals(now):
            with self._waited(approval, "expired", now):
                result = await announced(
                    functools.partial(
                        self.external_ends.end,
                        row,
                        Outcome.APPROVAL_TIMEOUT,
                        f"{approval.tool} not decided within its approval deadline",
                        announce=announced.reachable,
                        status=AWAITING,
                    ),
                    f"the end of {row.turn_id}",
                )
            if result is not None:
                await self.ledger.close_approvals(row.turn_id, "expired", now)
                ended += result == ENDED
        return ended

    @staticmethod
    def _waited(approval: ApprovalRow, status: str, now: float, decided_by: str = "", reason: str = "") -> _EndAt:
        """The wait as one span of the turn's trace, from the request to the decision (or deadline)."""
        parent = extract({"traceparent": approval.traceparent}) if approval.traceparent else otel_context.get_current()
        span = tracer().start_span("approval.wait", context=parent, start_time=int(approval.requested_at * 1e9))
        span.set_attributes(
            {
                "roundtrip.turn_id": approval.turn_id,
                "roundtrip.approval_id": approval.approval_id,
                "roundtrip.tool": approval.tool,
                "roundtrip.tool_use_id": approval.tool_use_id,
                "roundtrip.decision": status,
                "roundtrip.decided_by": decided_by,
                "roundtrip.decided_at": now,
                "roundtrip.waited_s": round(now - approval.requested_at, 3),
                "roundtrip.reason": reason[:200],
            }
        )
        if status not in ("approved",):
            span.set_status(trace.Status(trace.StatusCode.ERROR, status))
        return _EndAt(span, int(now * 1e9))


def waiting_status(event: ApprovalRequested) -> SupportStatus:
    turn = event.turn
    return SupportStatus(
        **turn.addressed(),
        state=TurnState.WAITING_FOR_APPROVAL,
        until=event.expires_at,
        at=event.requested_at,
        reason=event.reason,
        approval_id=event.approval_id,
        metadata=turn.metadata,
    )


def resumed(
    request: ApprovalRequested, decision: ApprovalDecided, approved: bool, now: float, since: float | None = None
) -> CheckToolCalls | CallModel:
    """The step's next message; the time spent waiting (`since`: when the guard recorded the wait) does not count
    against the turn's own deadline, which is the ledger's: the guard records no request carrying another."""
    turn: Turn = request.turn
    waited = max(0.0, now - (request.requested_at if since is None else since))
    if turn.deadline_at:
        turn = turn.model_copy(update={"deadline_at": round(turn.deadline_at + waited, 3)})
    if approved:
        call = ToolCall(
            id=request.call.id,
            name=request.call.name,
            input=request.call.input,
            fingerprint=fingerprint(request.call.name, request.call.input),
        )
        return CheckToolCalls(
            turn=turn,
            step=request.step,
            messages=request.messages,
            calls=[call],
            spent=request.spent,
            results=request.results,
            decisions=[decision],
        )
    denied = {
        "type": "tool_result",
        "tool_use_id": request.call.id,
        "is_error": True,
        "content": (
            "Not run: a member of staff reviewed this call and declined it"
            + (f": {decision.reason}" if decision.reason else "")
            + ". Nothing was changed. Explain this to the customer "
            "and do not make this call again."
        ),
    }
    content = in_tool_use_order(request.messages, [*request.results, denied])
    return CallModel(
        turn=turn,
        step=request.step,
        messages=[*request.messages, {"role": "user", "content": content}],
        spent=request.spent,
    )


class _EndAt:
    def __init__(self, span: trace.Span, end_ns: int) -> None:
        self.span, self.end_ns = span, end_ns

    def __enter__(self) -> trace.Span:
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, *exc: object) -> None:
        otel_context.detach(self._token)
        self.span.end(end_time=self.end_ns)


SHOWN = 80  # characters of a tool's input a log line shows


def _shown(tool_input: object) -> str:
    text = json.dumps(tool_input, ensure_ascii=False, default=str)
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"
