"""Admission: at most `limit` turns run at once, admitted in arrival order; the rest wait in support.requests.

A waiting request holds its place in the key-ordered consumer, which pauses fetching once full, so an overload
lengthens the queue in Kafka instead of starting turns the stuck-turn rule then ends. The count is this replica's:
the throttle also releases the turns the ledger says ended at another replica (docs/decisions/admission.md), and a
turn whose end is never seen nor read is forgotten after `forget_after_s`, so a miss only delays admission.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass


class Admission:
    def __init__(self, limit: int, forget_after_s: float) -> None:
        self.limit = limit
        self._forget_after = forget_after_s
        self._running: dict[str, float] = {}  # turn id -> admitted at (monotonic)
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._handed = 0  # slots handed to woken waiters that have not taken them yet

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _full(self) -> bool:
        return len(self._running) + self._handed >= self.limit or bool(self._waiting)

    async def admit(self, turn_id: str) -> float:
        """Wait for room (first come, first served), then count `turn_id` as running; returns the wait in seconds."""
        if turn_id in self._running:
            return 0.0
        started = time.monotonic()
        if self._full():
            self._forget_stale()
        if self._full():
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                while True:
                    try:
                        await asyncio.wait_for(asyncio.shield(waiter), timeout=max(1.0, self._forget_after / 10))
                        break
                    except TimeoutError:
                        self._forget_stale()
            except asyncio.CancelledError:
                if waiter.done():  # a slot was handed to us: pass it on
                    self._handed -= 1
                    self.wake()
                else:
                    self._waiting.remove(waiter)
                raise
            self._handed -= 1
        self._running[turn_id] = time.monotonic()
        return time.monotonic() - started

    def running_ids(self) -> list[str]:
        return list(self._running)

    def release(self, turn_id: str) -> None:
        if self._running.pop(turn_id, None) is not None:
            self.wake()

    def wake(self) -> None:
        while self._waiting and len(self._running) + self._handed < self.limit:
            waiter = self._waiting.popleft()
            if not waiter.done():
                self._handed += 1
                waiter.set_result(None)

    def _forget_stale(self) -> None:
        cutoff = time.monotonic() - self._forget_after
        for turn_id in [t for t, at in self._running.items() if at < cutoff]:
            del self._running[turn_id]
        self.wake()


@dataclass(frozen=True)
class Lanes:
    """The admission of each lane: a batch turn waits for a slot of its own, never for an interactive turn's."""

    interactive: Admission
    batch: Admission

    def of(self, lane: str) -> Admission:
        return self.batch if lane == "batch" else self.interactive

    def release(self, turn_id: str) -> None:
        self.interactive.release(turn_id)
        self.batch.release(turn_id)
