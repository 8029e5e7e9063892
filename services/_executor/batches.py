"""A batch run: verify the gate's signature, claim the step in the turn's fence, run the calls, call the model.

Order matters (core.py): the signature is checked first (a forged batch is refused even when it reuses a real turn and
step, never taken for a duplicate), then duplicates, then the turn's deadline, then the fence (one conditional UPDATE
that succeeds only while the turn is live at this step); only then do the calls run. A held call's batch runs the
others, then becomes an ApprovalRequested.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from opentelemetry import trace

from roundtrip._executor.runner import Runner
from roundtrip._kernel.storage import sideeffects
from roundtrip._kernel.wire.approvals import Verifier, approval_id_for, in_tool_use_order
from roundtrip._kernel.wire.events import ApprovalRequested, CallModel, ExecuteToolBatch, Turn
from roundtrip._kernel.wire.limits import fit_transcript

log = logging.getLogger("roundtrip.executor")
security = logging.getLogger("roundtrip.security")

LEASE_MARGIN_S = 5.0  # beyond the tools' own timeouts: publishing the next call, a slow backend answer


class BatchNotRun(Exception):
    """An approved batch that must not run any more: its approval expired, or its turn ended or moved on."""


def verify(batch: ExecuteToolBatch, verifier: Verifier) -> None:
    """Raise (ApprovalError) for a batch the gate did not sign as it is, with a `roundtrip.security` line."""
    try:
        verifier.verify(batch)
    except Exception as exc:
        security.error(
            "refused batch for turn %r step %d (customer %r): %s",
            batch.turn.turn_id,
            batch.step,
            batch.turn.customer_id,
            exc,
        )
        trace.get_current_span().add_event("batch refused", {"roundtrip.reason": str(exc)[:200]})
        raise


def lease_for(batch: ExecuteToolBatch, runner: Runner) -> float:
    approved = sum(1 for c in batch.calls if c.approved)
    return runner.timeout_s * (1 if runner.concurrent(batch.calls) else max(1, approved)) + LEASE_MARGIN_S


class BatchFence(Protocol):
    """What running a batch asks the turn's fence (turnstore.Fence; roundtrip.testing's OpenFence in one process)."""

    async def claim_batch(self, turn: Turn, step: int, lease_s: float, now: float) -> bool: ...

    async def record_acted(self, turn_id: str, step: int, lines: str) -> None: ...


async def run_calls(batch: ExecuteToolBatch, runner: Runner, fence: BatchFence) -> list[dict[str, Any]]:
    """Run the calls of a batch `verify` accepted, under the fence's claim; their results. BatchNotRun when too late
    or its turn may not act any more."""
    span = trace.get_current_span()
    now = time.time()
    if batch.expires_at and now > batch.expires_at:
        span.add_event("batch not run: approval expired", {"roundtrip.late_s": now - batch.expires_at})
        raise BatchNotRun(
            f"approval expired {now - batch.expires_at:.1f} s ago (the turn's deadline); the guard ends the turn"
        )
    if not await fence.claim_batch(batch.turn, batch.step, lease_for(batch, runner), now):
        span.add_event("batch not run: the turn has ended or moved on", {"roundtrip.step": batch.step})
        raise BatchNotRun(
            "the turn has ended, been cancelled, moved past this step or passed its deadline; nothing was run"
        )
    return await runner.run(batch.calls, batch.turn)


async def next_command(
    batch: ExecuteToolBatch, ran: list[dict[str, Any]], runner: Runner, fence: BatchFence, max_transcript_bytes: int
) -> CallModel | ApprovalRequested:
    """What follows the calls that ran: their side effects recorded in the fence, then the next model call (or the
    held call's ApprovalRequested)."""
    span = trace.get_current_span()
    if acted := sideeffects.lines(batch.calls, ran, runner.registry.is_serial):
        # before the next call goes out: an end from outside the loop says what was done from it
        await fence.record_acted(batch.turn.turn_id, batch.step, acted)
    results = [*batch.results, *ran]
    held = next((c for c in batch.calls if c.hold), None)
    if held is not None and held.hold is not None:
        span.add_event(
            "waiting for a person's approval", {"roundtrip.tool": held.name, "roundtrip.tool_use_id": held.id}
        )
        return ApprovalRequested(
            approval_id=approval_id_for(batch.turn.turn_id, batch.step, held.id),
            turn=batch.turn,
            step=batch.step,
            call=held,
            reason=held.hold.reason,
            entities=held.hold.entities,
            input_sha256=held.hold.input_sha256,
            requested_at=round(time.time(), 3),
            expires_at=held.hold.expires_at,
            messages=batch.messages,
            results=results,
            results_before=len(batch.results),
            spent=batch.spent,
            hold_key_id=held.hold.key_id,
            hold_signature=held.hold.signature,
        )
    results = in_tool_use_order(batch.messages, results)
    messages, replaced = fit_transcript([*batch.messages, {"role": "user", "content": results}], max_transcript_bytes)
    if replaced:
        log.warning(
            "turn %s step %d: %d large blocks of the transcript replaced by markers",
            batch.turn.turn_id,
            batch.step,
            replaced,
        )
    return CallModel(turn=batch.turn, step=batch.step, messages=messages, spent=batch.spent)
