"""Gate handler: check every call of a step, sign the batch, hand it to the executors."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from services.gate.authorization import EntityLookup, LookupFailed, authorize
from services.gate.validation import InputValidator
from services.kernel.approvals import Signer
from services.kernel.events import CheckedCall, CheckToolCalls, ExecuteToolBatch, ToolCall
from services.kernel.telemetry import tracer
from services.tools.context import ToolContext
from services.tools.registry import Registry


@dataclass
class Gate:
    registry: Registry
    lookup: EntityLookup
    signer: Signer
    shop: Any = None  # handed to policies through ToolContext
    batch_ttl_s: float = 60.0  # an approval is void after this (the guard gives up on a stuck turn later)

    def __post_init__(self) -> None:
        self.validators = {name: InputValidator(spec.input_schema) for name, spec in self.registry.specs.items()}

    async def check_call(self, call: ToolCall, customer_id: str, turn_id: str, blocked: str | None = None) -> CheckedCall:
        def reject(why: str) -> CheckedCall:
            return CheckedCall(id=call.id, name=call.name, input=call.input, approved=False, error=why)

        if blocked:
            return reject(blocked)
        spec = self.registry.get(call.name)
        if spec is None:
            known = ", ".join(sorted(self.registry.specs))
            return reject(f"Unknown tool {call.name[:80]!r}. Available tools: {known}.")
        problems = self.validators[call.name].problems(call.input)
        if problems:
            return reject(f"Invalid input for {call.name}: " + "; ".join(problems) + ". Fix these fields and call again.")
        ctx = ToolContext(customer_id=customer_id, tool_use_id=call.id, idempotency_key=f"{turn_id}:{call.id}", shop=self.shop)
        try:
            denial = await authorize(spec, call.input, ctx, self.lookup, self.registry.policy(call.name))
        except LookupFailed:
            return reject("The order system could not be reached to verify this call; nothing was done. Try again shortly.")
        if denial:
            return reject(f"Not allowed: {denial}")
        return CheckedCall(id=call.id, name=call.name, input=call.input, approved=True)

    async def check(self, command: CheckToolCalls) -> ExecuteToolBatch:
        checked = []
        for call in command.calls:
            with tracer().start_as_current_span("gate.check_call") as span:
                span.set_attributes({"roundtrip.tool": call.name[:80], "roundtrip.tool_use_id": call.id, "roundtrip.fingerprint": call.fingerprint})
                result = await self.check_call(call, command.turn.customer_id, command.turn.turn_id, command.blocked.get(call.id))
                span.set_attribute("roundtrip.approved", result.approved)
                if not result.approved:
                    span.set_status(trace.Status(trace.StatusCode.ERROR, (result.error or "")[:200]))
                checked.append(result)
        batch = ExecuteToolBatch(
            turn=command.turn, step=command.step, messages=command.messages, calls=checked, spent=command.spent,
            expires_at=round(time.time() + self.batch_ttl_s, 3),
        )
        return self.signer.sign(batch)
