"""A turn whose model call waits for the API's capacity (services/_kernel/storage/turnstore.py, WAITING): still live,
never flagged stuck however long it waits, still ended at its deadline, counted for the gateway; and the key-ordered
consumer the model service holds back meanwhile (services/_kernel/kafka/consumer.py, `hold`)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from roundtrip._guard.ledger import Ledger
from roundtrip._kernel.storage.turnstore import RUNNING, WAITING, Fence
from tests import waiting
from tests.consumers import key_ordered
from tests.databases import migrated
from tests.ledger_steps import advance, flag_stuck


def turn(turn_id: str) -> dict:
    return {"turn_id": turn_id, "request_id": "r", "conversation_id": f"c_{turn_id}", "customer_id": "cus_1"}


T1 = SimpleNamespace(**turn("t1"))  # as the fence and the ledger take a turn: its id and principal


async def test_a_waiting_turn_is_live_never_stuck_ended_at_its_deadline_and_counted(tmp_path):
    url = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    ledger, fence = await Ledger.open(url), await Fence.open(url)
    try:
        start = time.time() - 1000  # long ago: an idle running turn would be stuck by now
        await ledger.start(turn("t1"), pending="{}", now=start, deadline_at=start + 2000)
        await ledger.start(turn("t2"), pending="{}", now=start, deadline_at=start + 2000)
        assert await fence.claim_model_call(T1, 0, now=start)
        assert await fence.wait_for_capacity(T1, 0, now=start)
        assert not await fence.wait_for_capacity(T1, 3, now=time.time())  # not at that step: refused
        assert await ledger.waiting_for_capacity() == 1
        idle, expired, _ = await ledger.overdue(time.time(), stuck_after_s=60, grace_s=30, deadline_s=300)
        assert [r.turn_id for r in idle] == ["t2"] and not expired  # only the running one is idle
        assert not await flag_stuck(ledger, "t1", time.time(), stuck_after_s=60)
        assert await advance(
            ledger, T1, 1, {}, 0.0, pending="{}", now=time.time()
        )  # the call answered: the next step runs
        assert (await ledger.get("t1")).status == RUNNING
        assert await fence.wait_for_capacity(T1, 1, now=time.time())
        _, expired, _ = await ledger.overdue(start + 2001, stuck_after_s=60, grace_s=30, deadline_s=300)
        assert (
            "t1" in [r.turn_id for r in expired] and (await ledger.get("t1")).status == WAITING
        )  # its deadline still ends it
    finally:
        await ledger.close()
        await fence.close()


class FakeKafka:
    def __init__(self) -> None:
        self.paused = False

    def assignment(self):
        return {"tp"}

    def pause(self, *parts):
        self.paused = True

    def resume(self, *parts):
        self.paused = False

    async def getmany(self, timeout_ms=0, max_records=None):
        # a fake poll's wait: the consumer loop yields as on a real broker
        await asyncio.sleep(min(timeout_ms, 20) / 1000)
        return {}


async def test_a_held_back_consumer_pauses_fetching_and_resumes_when_released():
    # a processing step that only yields to the loop
    consumer = key_ordered(process=lambda record: asyncio.sleep(0), idle_wait_ms=50)
    kafka = FakeKafka()
    task = asyncio.create_task(consumer.run(kafka))
    await asyncio.sleep(0.05)  # an idle poll (50 ms): a pause unasked for would have come by now
    assert not kafka.paused
    consumer.hold(True)
    await waiting.until(lambda: kafka.paused and consumer.paused, 5, "the pause")
    consumer.hold(False)
    await waiting.until(lambda: not kafka.paused and not consumer.paused, 5, "the resume")
    await consumer.drain()
    await asyncio.wait_for(task, 2)


async def test_the_ledger_says_which_of_a_gateways_running_turns_have_ended(tmp_path):
    """What a gateway replica asks every second for the turns whose outcome another replica read."""
    url = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    ledger = await Ledger.open(url)
    try:
        now = time.time()
        for name in ("t1", "t2", "t3"):
            await ledger.start(turn(name), pending="{}", now=now, deadline_at=now + 300)
        assert await ledger.end("t2", "cancelled", pending="{}") is not None
        assert await ledger.ended_among(["t1", "t2", "t3", "t_unknown"]) == {"t2"}
        assert await ledger.ended_among([]) == set()
    finally:
        await ledger.close()
