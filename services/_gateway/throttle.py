"""Fewer new turns while running turns wait for the model's capacity: the admission limit follows the ledger.

While many running turns wait (`waiting` in the ledger), the limit is cut, so the capacity goes to the turns already
running; while few wait it climbs back. Some turns waiting is the point: the model service then always has a call
ready for its next slot. Every replica reads the same ledger, so they close and open together with no coordinator.
Batch turns have their own admission, which the model's capacity does not move (their calls wait in batches).
"""

from __future__ import annotations

import asyncio
import logging

from roundtrip._gateway.admission import Admission, Lanes
from roundtrip._kernel.storage.turnstore import TurnStore

log = logging.getLogger("roundtrip.gateway")

CHECK_S = 1.0
HIGH, LOW = 0.5, 0.2  # shares of the running turns waiting for capacity: above HIGH cut, below LOW climb back
BETA = 0.9  # a cut: at most this share of the turns running now
STEP = 0.05  # a climb: this share of the configured limit per check
BATCH_CHECK_EVERY = 30  # batch turns run for hours: the ledger is asked about their ends once in this many checks
ASKED_AT_ONCE = 500  # turn ids per question to the ledger (a bound on the statement's parameters)


class Throttle:
    def __init__(self, lanes: Lanes, store: TurnStore) -> None:
        self.admission = lanes.interactive
        self.batch = lanes.batch
        self.store = store
        self.configured = self.admission.limit
        self.waiting = 0
        self.checks = 0

    def adjust(self, waiting: int) -> None:
        """One check's decision, from the count of turns waiting for capacity."""
        self.waiting = waiting
        admission = self.admission
        if waiting > HIGH * admission.running:
            admission.limit = max(1, min(admission.limit, int(admission.running * BETA)))
        elif waiting < LOW * admission.running and admission.limit < self.configured:
            admission.limit = min(self.configured, admission.limit + max(1, int(self.configured * STEP)))
            admission.wake()

    async def release_ended(self, admission: Admission) -> None:
        """Free the places of the turns whose outcome went to another replica."""
        running = admission.running_ids()
        for start in range(0, len(running), ASKED_AT_ONCE):
            for turn_id in await self.store.ended_among(running[start : start + ASKED_AT_ONCE]):
                admission.release(turn_id)

    async def run(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                self.adjust(await self.store.waiting_for_capacity())
                await self.release_ended(self.admission)
                self.checks += 1
                if self.checks % BATCH_CHECK_EVERY == 0:
                    await self.release_ended(self.batch)
                failing = False
            except Exception as exc:  # noqa: BLE001 - the admission goes on as it is; said once per outage
                if not failing:
                    log.warning(
                        "cannot read the turn ledger for turns waiting on the model's capacity (%s: %s); "
                        "admission stays at %d",
                        type(exc).__name__,
                        exc,
                        self.admission.limit,
                    )
                failing = True
