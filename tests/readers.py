"""Stopping a test's Kafka reader: its reading task, then its consumer."""

from __future__ import annotations

import asyncio
from typing import Any


async def stop_reader(task: asyncio.Task[Any], consumer: Any) -> None:
    """Cancel `task` (the loop reading `consumer`) and wait until it is gone, then stop the consumer.

    aiokafka 0.14's consumer.stop() awaits each fetch it cancels; one that was in its retry backoff after a failed
    fetch (a broker that was killed, a request that timed out) re-raises its CancelledError there. That one is not a
    cancellation of ours: it is swallowed, unless this task itself is being cancelled."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
