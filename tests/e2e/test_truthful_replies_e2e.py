"""A turn that ends early after it cancelled an order says so (issue 21, item 4): the reply names the cancelled order
and does not say nothing was changed, whether the model fails after the cancel (the loop's end) or the guard ends the
turn from outside the loop (an operator's cancel, while the model call after the cancel is being answered).

The whole fleet as processes over the real broker. Each model call takes 2 s at the simulator; the test acts while a
given call is being answered (the simulator's /health says so), so only what comes after it meets the change.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from services.console import cancel_turn
from services.kernel import topics
from services.kernel.events import Outcome
from tests.e2e.test_faults_e2e import _customer_with_a_cancellable_order

LATENCY_MS = 2000  # each model call takes 2 s: the window in which the test starts the burst


def cancelled_by(before: dict, after: dict) -> list[str]:
    return [order for order, (_, status) in after.items() if status == "cancelled" and before[order][1] != "cancelled"]


async def _in_flight(simulator: httpx.AsyncClient, served: int, timeout: float = 30) -> None:
    """Until the simulator has answered `served` requests and is answering the next one."""
    deadline = time.monotonic() + timeout
    while True:
        health = (await simulator.get("/health")).json()
        if health["served"] == served and health["in_flight"] >= 1:
            return
        assert health["served"] <= served and time.monotonic() < deadline, f"missed the model call being answered: {health}"
        await asyncio.sleep(0.05)


async def test_a_model_error_after_a_cancel_names_the_cancelled_order(client, fleet, fleet_settings, shop_orders):
    settings = fleet_settings[0]
    customer = _customer_with_a_cancellable_order(shop_orders, settings)
    async with fleet.reconfigured(("simulator",), simulator_latency_ms=LATENCY_MS), \
            httpx.AsyncClient(base_url=settings.model_base_url, timeout=10) as simulator:
        before = shop_orders()
        served = (await simulator.get("/health")).json()["served"]
        request_id = await client.ask("cancel my last order", customer=customer, persona="careful")
        # step 1 (list_orders) answered and run; the model call that asks for the cancel is being answered: from now on
        # the API fails (the SDK's retries included), so the call after the cancel ends the turn with model_error
        await client.wait_for(lambda: [c for c in client.of_turn(topics.MODEL_CALLS, request_id) if c["step"] == 1], timeout=60)
        await _in_flight(simulator, served + 1)
        await simulator.post("/v1/_overload", json={"seconds": 120, "status": 500})
        try:
            reply = await client.reply(request_id, timeout=90)
        finally:
            await simulator.post("/v1/_overload", json={"seconds": 0})
    (order,) = cancelled_by(before, shop_orders())
    assert reply.outcome is Outcome.MODEL_ERROR and reply.steps == 3
    assert f"I cancelled order {order}" in reply.text and "Nothing else was changed" in reply.text
    assert "Nothing was changed" not in reply.text and "try again" not in reply.text.lower()


async def test_a_turn_the_guard_ends_from_outside_after_a_cancel_names_the_cancelled_order(client, fleet, fleet_settings,
                                                                                          shop_orders):
    settings = fleet_settings[0]
    customer = _customer_with_a_cancellable_order(shop_orders, settings)
    async with fleet.reconfigured(("simulator",), simulator_latency_ms=LATENCY_MS), \
            httpx.AsyncClient(base_url=settings.model_base_url, timeout=10) as simulator:
        before = shop_orders()
        served = (await simulator.get("/health")).json()["served"]
        request_id = await client.ask("cancel my last order", customer=customer, persona="careful")
        # the cancel ran (step 2's results are on their way to the model) and the model call after it is being answered
        calls = await client.wait_for(lambda: [c for c in client.of_turn(topics.MODEL_CALLS, request_id) if c["step"] == 2],
                                      timeout=60)
        await _in_flight(simulator, served + 2)
        assert await cancel_turn(settings, calls[0]["turn"]["turn_id"], "stopped by an operator") == 0
        reply = await client.reply(request_id, timeout=60)
    (order,) = cancelled_by(before, shop_orders())
    assert reply.outcome is Outcome.CANCELLED
    assert f"I cancelled order {order}" in reply.text and "Nothing else was changed" in reply.text
