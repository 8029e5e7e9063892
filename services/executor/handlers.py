"""Executor handler: verify the gate's signature, run the batch, produce the next model call."""

from __future__ import annotations

import logging
import time

from services.executor.runner import Runner
from services.kernel.approvals import Signer
from services.kernel.events import CallModel, ExecuteToolBatch

security = logging.getLogger("roundtrip.security")


class BatchExpired(Exception):
    """An approved batch that arrived too late to run (its turn is stuck or over)."""


async def execute(batch: ExecuteToolBatch, signer: Signer, runner: Runner) -> CallModel:
    try:
        signer.verify(batch)
    except Exception as exc:
        security.error(
            "refused batch for turn %s step %d (customer %s): %s",
            batch.turn.turn_id, batch.step, batch.turn.customer_id, exc,
        )
        raise
    if batch.expires_at and time.time() > batch.expires_at:
        raise BatchExpired(f"approval expired {time.time() - batch.expires_at:.1f} s ago; the guard ends the turn")
    results = await runner.run(batch.calls, batch.turn)
    return CallModel(
        turn=batch.turn,
        step=batch.step,
        messages=[*batch.messages, {"role": "user", "content": results}],
        spent=batch.spent,
    )
