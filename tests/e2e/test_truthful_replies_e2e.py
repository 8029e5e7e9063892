"""A turn that ends early after it cancelled an order says so (issue 21, item 4): the reply names the cancelled order
and does not say nothing was changed, whether the model fails after the cancel (the loop's end) or the guard ends the
turn from outside the loop (an operator's cancel, while the model call after the cancel is being answered).

The whole fleet as processes over the real broker. Each model call takes 2 s at the simulator; the test acts while a
given call is being answered (the simulator's /health says so), so only what comes after it meets the change.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from roundtrip._cli.turns import cancel_turn
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome
from tests.e2e.test_faults_e2e import _customer_with_a_cancellable_order

LATENCY_MS = 2000  # each model call takes 2 s: the window in which the test acts


@dataclass
class Asked:
    request_id: str
    simulator: httpx.AsyncClient
    served: int  # requests the simulator had answered before the ask
    before: dict  # the shop's orders before the ask

    async def answering(self, client, step: int, timeout: float = 30) -> str:
        """Once the results of `step` are sent and the simulator is answering the next model call: the turn id."""
        calls = await client.wait_for(
            lambda: [c for c in client.of_turn(topics.MODEL_CALLS, self.request_id) if c["step"] == step], timeout=60
        )
        deadline = time.monotonic() + timeout
        while True:
            health = (await self.simulator.get("/health")).json()
            if health["served"] == self.served + step and health["in_flight"] >= 1:
                return calls[0]["turn"]["turn_id"]
            assert health["served"] <= self.served + step and time.monotonic() < deadline, f"missed the call: {health}"
            await asyncio.sleep(0.05)  # poll interval: the stub's served counter

    def cancelled(self, after: dict) -> list[str]:
        return [o for o, (_, status) in after.items() if status == "cancelled" and self.before[o][1] != "cancelled"]


@asynccontextmanager
async def asked_to_cancel(client, fleet, settings, shop_orders):
    """ "cancel my last order" (careful: list_orders, cancel_order, the answer) with model calls of LATENCY_MS."""
    customer = _customer_with_a_cancellable_order(shop_orders, settings)
    async with (
        fleet.reconfigured(("simulator",), simulator_latency_ms=LATENCY_MS),
        httpx.AsyncClient(base_url=settings.model_base_url, timeout=10) as simulator,
    ):
        before, served = shop_orders(), (await simulator.get("/health")).json()["served"]
        request_id = await client.ask("cancel my last order", customer=customer, persona="careful")
        yield Asked(request_id, simulator, served, before)


async def test_a_model_error_after_a_cancel_names_the_cancelled_order(client, fleet, fleet_settings, shop_orders):
    async with asked_to_cancel(client, fleet, fleet_settings[0], shop_orders) as asked:
        # the model call that asks for the cancel is being answered: from now on the API fails (the SDK's retries
        # included), so the call after the cancel ends the turn with model_error
        await asked.answering(client, step=1)
        await asked.simulator.post("/v1/_overload", json={"seconds": 120, "status": 500})
        try:
            reply = await client.reply(asked.request_id, timeout=90)
        finally:
            await asked.simulator.post("/v1/_overload", json={"seconds": 0})
    (order,) = asked.cancelled(shop_orders())
    assert reply.outcome is Outcome.MODEL_ERROR and reply.steps == 3
    assert f"I cancelled order {order}" in reply.text and "Nothing else was changed" in reply.text
    assert "Nothing was changed" not in reply.text and "try again" not in reply.text.lower()


async def test_a_turn_the_guard_ends_from_outside_after_a_cancel_names_the_cancelled_order(
    client, fleet, fleet_settings, shop_orders
):
    settings = fleet_settings[0]
    async with asked_to_cancel(client, fleet, settings, shop_orders) as asked:
        turn_id = await asked.answering(client, step=2)  # the cancel ran; the model call after it is being answered
        assert await cancel_turn(settings, turn_id, "stopped by an operator") == 0
        reply = await client.reply(asked.request_id, timeout=60)
    (order,) = asked.cancelled(shop_orders())
    assert reply.outcome is Outcome.CANCELLED
    assert f"I cancelled order {order}" in reply.text and "Nothing else was changed" in reply.text
