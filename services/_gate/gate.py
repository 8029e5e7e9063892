"""Gate handler: check every call of a step, sign the batch, hand it to the executors.

`check_call` never raises: any input, however hostile, becomes either an approval or a rejection with a sentence the
model can act on. A call whose approval rule asks for a person is approved with a `hold`; it runs only when the
command carries a person's signed decision for exactly that call (turn, tool_use id, input digest), checked here again.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from roundtrip._gate.authorization import EntityLookup, LookupFailed, OwnershipCache, StepLookups, authorize
from roundtrip._gate.validation import SAFE_INTEGER, InputValidator
from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.kafka import faults
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.observability.telemetry import mark_error, tracer
from roundtrip._kernel.wire.approvals import ApprovalError, DecisionVerifier, Signer, input_digest
from roundtrip._kernel.wire.events import (
    ApprovalDecided,
    ApprovalHold,
    CheckedCall,
    CheckToolCalls,
    Decision,
    ExecuteToolBatch,
    ToolCall,
)
from roundtrip._sdk.context import Dependencies, ToolContext
from roundtrip._sdk.registry import Registry, allow
from roundtrip._sdk.texts import gate_message

log = logging.getLogger("roundtrip.gate")
security = logging.getLogger("roundtrip.security")

OWNERSHIP_TTL_S = 30.0  # how long a positive (customer, entity) answer is reused by policy-free tools


@dataclass
class Gate:
    registry: Registry
    lookup: EntityLookup
    signer: Signer
    deps: Dependencies = field(default_factory=Dependencies)
    batch_ttl_s: float = 60.0  # only for a turn without a deadline; otherwise the turn's deadline
    ownership_ttl_s: float = OWNERSHIP_TTL_S  # 0 turns the cross-step ownership cache off
    step_memo: bool = True
    concurrent: bool = True
    agent_settings: Any = None
    messages: Callable[..., str] = gate_message
    decisions: DecisionVerifier | None = None  # None: no decision is ever accepted
    approval_timeout_s: float = 900.0
    unavailable: Callable[[str], str | None] = lambda name: None  # why a known tool cannot be called now (MCP down)
    ownership: OwnershipCache | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.validators = {name: InputValidator(spec.input_schema) for name, spec in self.registry.specs.items()}
        self.ownership = OwnershipCache(self.ownership_ttl_s, SYSTEM) if self.ownership_ttl_s > 0 else None

    async def check_call(
        self,
        call: ToolCall,
        customer_id: str,
        turn_id: str,
        blocked: str | None,
        lookups: StepLookups,
        decision: ApprovalDecided | None,
        metadata: dict[str, Any] | None,
    ) -> CheckedCall:
        try:
            return await self._check_call(call, customer_id, turn_id, blocked, lookups, decision, metadata)
        except faults.RetryLater:
            raise  # an agent's backend is away: the step waits for it (nothing is approved meanwhile)
        except Exception as exc:  # the gate fails closed and keeps serving
            if (dependency := faults.unavailable(exc)) is not None:  # what a call reaches is the agent's backends
                raise faults.RetryLater(dependency, f"{type(exc).__name__}: {exc}", backend=True) from exc
            log.exception("gate failed while checking %s (%s); rejecting it", str(call.name)[:80], call.id)
            metrics.gate_rejections.labels(self._tool_label(call.name), "internal_error").inc()
            return CheckedCall(
                id=call.id,
                name=call.name,
                input=call.input,
                approved=False,
                error=self.messages("internal_error"),
            )

    async def _check_call(
        self,
        call: ToolCall,
        customer_id: str,
        turn_id: str,
        blocked: str | None,
        lookups: StepLookups,
        decision: ApprovalDecided | None,
        metadata: dict[str, Any] | None,
    ) -> CheckedCall:
        def reject(why: str, reason: str) -> CheckedCall:
            metrics.gate_rejections.labels(self._tool_label(call.name), reason).inc()
            return CheckedCall(id=call.id, name=call.name, input=call.input, approved=False, error=why)

        if blocked:
            return reject(blocked, "blocked_repeat")
        name = call.name if isinstance(call.name, str) else str(call.name)
        spec = self.registry.get(name)
        if spec is None and (why := self.unavailable(name)):
            return reject(why, "tool_unavailable")
        if spec is None:
            return reject(self._unknown(name), "unknown_tool")
        if name not in self.validators:
            self.validators[name] = InputValidator(spec.input_schema)
        problems = self.validators[name].problems(call.input)
        if problems:
            return reject(self.messages("invalid_input", tool=name, problems="; ".join(problems)), "invalid_input")
        if not customer_id:
            security.error("turn %r: no principal on the turn; call %r refused", turn_id, call.id)
            return reject(self.messages("no_principal"), "no_principal")
        policy = self.registry.policy(name)
        ctx = self._context(call, customer_id, turn_id, metadata)
        entities: dict[str, dict[str, Any]] = {}
        rule = self.registry.approval_rule(name)
        try:  # a tool with an approval rule reads entity state (a total), so it never uses the ownership cache
            denial = await authorize(
                spec,
                call.input,
                ctx,
                lookups.for_call(state_free=policy is allow and rule is None),
                policy,
                resolved=entities,
                say=self.messages,
                tools=self.registry.specs,
            )
        except LookupFailed as exc:
            log.warning("turn %s: %s", turn_id, exc)
            return reject(self.messages("lookup_failed"), "lookup_failed")
        if denial:
            return reject(self.messages("not_allowed", reason=denial), "not_allowed")
        why = rule(call.input, entities, self.agent_settings) if rule is not None else None
        if not why:
            return CheckedCall(id=call.id, name=name, input=call.input, approved=True)
        return self._held_or_decided(call, name, turn_id, why, entities, decision, reject)

    def _context(self, call: ToolCall, customer_id: str, turn_id: str, metadata: dict[str, Any] | None) -> ToolContext:
        return ToolContext(
            customer_id=customer_id,
            tool_use_id=call.id,
            idempotency_key=f"{turn_id}:{call.id}",
            deps=self.deps,
            metadata=dict(metadata or {}),
        )

    def _held_or_decided(
        self,
        call: ToolCall,
        name: str,
        turn_id: str,
        why: str,
        entities: dict[str, dict[str, Any]],
        decision: ApprovalDecided | None,
        reject: Callable[[str, str], CheckedCall],
    ) -> CheckedCall:
        """A call its approval rule holds: held for a person, or approved by their decision when it fits this call."""
        digest = input_digest(name, call.input)
        if decision is None:
            hold = ApprovalHold(
                reason=why,
                entities=entities,
                input_sha256=digest,
                expires_at=round(time.time() + self.approval_timeout_s, 3),
            )
            return CheckedCall(id=call.id, name=name, input=call.input, approved=True, hold=hold)
        problem = self._decision_problem(decision, call, turn_id, digest)
        if problem:
            security.error(
                "turn %r: approval %r refused for call %r: %s", turn_id, decision.approval_id, call.id, problem
            )
            return reject(self.messages("decision_refused", problem=problem), "not_allowed")
        return CheckedCall(id=call.id, name=name, input=call.input, approved=True, approved_by=decision.decided_by)

    def _unknown(self, name: str) -> str:
        known = ", ".join(sorted(self.registry.specs))
        close = difflib.get_close_matches(name.strip().lower()[:80], list(self.registry.specs), n=1, cutoff=0.75)
        if close:
            return self.messages("unknown_tool_close", tool=repr(name[:80]), close=close[0], tools=known)
        return self.messages("unknown_tool", tool=repr(name[:80]), tools=known)

    def _decision_problem(self, decision: ApprovalDecided, call: ToolCall, turn_id: str, digest: str) -> str | None:
        """Why a decision does not let exactly this call run (None: it does)."""
        if self.decisions is None:
            return "this gate accepts no approval decisions (no decision keys)"
        try:
            self.decisions.verify(decision)
        except ApprovalError as exc:
            return f"the approval is not valid ({exc})"
        if decision.decision is not Decision.APPROVE:
            return "the call was not approved"
        if (decision.turn_id, decision.tool_use_id) != (turn_id, call.id):
            return "the approval was given for another call"
        if decision.input_sha256 != digest:
            return "the approval was given for other arguments than these"
        return None

    def _backend_away(self, call: ToolCall, command: CheckToolCalls, away: faults.RetryLater) -> CheckedCall:
        """An agent's backend is still away: before the turn's deadline the step waits (raised again; the consumer
        holds this conversation only); after it, the call is refused as lookup_failed, so the step is answered."""
        deadline = command.turn.deadline_at
        if not away.backend:
            raise away
        if not deadline or time.time() < deadline:
            away.until = deadline or None
            raise away
        log.warning(
            "turn %s: call %s refused: its backend is still away at the turn's deadline (%s)",
            command.turn.turn_id,
            call.id,
            away,
        )
        metrics.gate_rejections.labels(self._tool_label(call.name), "lookup_failed").inc()
        return CheckedCall(
            id=call.id, name=call.name, input=call.input, approved=False, error=self.messages("lookup_failed")
        )

    def _tool_label(self, name: object) -> str:
        """The tool as a metric label: a name the model made up is not a new time series."""
        return name if isinstance(name, str) and name in self.registry.specs else "unknown"

    async def _traced(self, call: ToolCall, command: CheckToolCalls, lookups: StepLookups) -> CheckedCall:
        with tracer().start_as_current_span("gate.check_call") as span:
            span.set_attributes(
                {
                    "roundtrip.tool": str(call.name)[:80],
                    "roundtrip.tool_use_id": call.id,
                    "roundtrip.fingerprint": call.fingerprint,
                    "roundtrip.turn_id": command.turn.turn_id,
                }
            )
            decision = next((d for d in command.decisions if d.tool_use_id == call.id), None)
            try:
                result = await self.check_call(
                    call,
                    command.turn.customer_id,
                    command.turn.turn_id,
                    command.blocked.get(call.id),
                    lookups,
                    decision,
                    command.turn.metadata,
                )
            except faults.RetryLater as away:
                result = self._backend_away(call, command, away)
            span.set_attribute("roundtrip.approved", result.approved)
            if result.hold:
                span.set_attribute("roundtrip.hold", result.hold.reason[:200])
            if result.approved_by:
                span.set_attribute("roundtrip.approved_by", result.approved_by)
            if not result.approved:
                mark_error(span, f"rejected: {result.error or ''}", "rejected")
            return result

    def _signed(self, batch: ExecuteToolBatch) -> ExecuteToolBatch:
        """The batch, its held call carrying the gate's signature of the hold as the approver will read it: the guard
        records a wait only under it, so no writer of turn.approval_requests can make a turn wait for another customer
        or call, nor show the person other words."""
        calls = []
        for call in batch.calls:
            if call.hold is not None:
                key_id, signature = self.signer.sign_hold(batch, call)
                hold = call.hold.model_copy(update={"key_id": key_id, "signature": signature})
                call = call.model_copy(update={"hold": hold})
            calls.append(call)
        return self.signer.sign(batch.model_copy(update={"calls": calls}))

    def step_lookups(self) -> StepLookups:
        """The look-ups of one step: its calls share them."""
        return StepLookups(self.lookup, self.ownership, self.step_memo)

    async def check(self, command: CheckToolCalls) -> ExecuteToolBatch:
        lookups = self.step_lookups()
        if self.concurrent and len(command.calls) > 1:
            checked = list(await asyncio.gather(*(self._traced(c, command, lookups) for c in command.calls)))
        else:
            checked = [await self._traced(c, command, lookups) for c in command.calls]
        checked = one_hold_per_step(checked, self.messages)
        batch = ExecuteToolBatch(
            turn=command.turn,
            step=command.step,
            messages=command.messages,
            calls=checked,
            spent=command.spent,
            results=command.results,
            # bound to the turn's own deadline, never a fresh TTL: stale work signed late stays stale
            expires_at=command.turn.deadline_at or round(time.time() + self.batch_ttl_s, 3),
        )
        try:
            return self._signed(batch)
        except Exception as exc:  # noqa: BLE001 - e.g. a number canonical JSON cannot carry, in the transcript
            log.warning(
                "turn %s step %d: batch not canonical (%s); signing a JSON-safe copy",
                command.turn.turn_id,
                command.step,
                exc,
            )
            return self._signed(ExecuteToolBatch.model_validate(json_safe(batch.model_dump(mode="json"))))


def one_hold_per_step(checked: list[CheckedCall], say: Callable[..., str]) -> list[CheckedCall]:
    """A step waits for at most one person's decision: a second held call is answered, not held."""
    out, held = [], None
    for call in checked:
        if call.hold and held is not None:
            metrics.gate_rejections.labels(call.name, "approval_pending").inc()
            call = CheckedCall(
                id=call.id,
                name=call.name,
                input=call.input,
                approved=False,
                error=say("approval_pending", held=held),
            )
        elif call.hold:
            held = f"{call.name} {call.id}"
        out.append(call)
    return out


def json_safe(value: Any) -> Any:
    """A copy that canonical JSON can carry: huge integers as floats, NaN/Infinity as null, lone surrogates replaced."""
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, str):
        return (
            value.encode("utf-8", "replace").decode("utf-8")
            if any(0xD800 <= ord(c) <= 0xDFFF for c in value)
            else value
        )
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int) and abs(value) > SAFE_INTEGER:
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
