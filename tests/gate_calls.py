"""One call checked by the gate as its step checks it (`Gate.check`): the step's own look-ups, nothing blocked, no
person's decision and no request metadata unless a test gives them."""

from __future__ import annotations

from typing import Any

from roundtrip._gate.gate import Gate
from roundtrip._kernel.wire.events import ApprovalDecided, CheckedCall, ToolCall


async def check_call(
    gate: Gate,
    call: ToolCall,
    customer_id: str,
    turn_id: str,
    *,
    blocked: str | None = None,
    decision: ApprovalDecided | None = None,
    metadata: dict[str, Any] | None = None,
) -> CheckedCall:
    return await gate.check_call(call, customer_id, turn_id, blocked, gate.step_lookups(), decision, metadata)
