"""Rate limits are "later", never "fail" (issue 21, item 1): the whole fleet as processes over the real broker,
against the simulator enforcing the Messages API's limits (its buckets and 429s, steered through /v1/_limits).

A turn whose call is refused with a 429 waits for capacity and still ends `end_turn`; an error that is not about
capacity (400, 401) ends the turn at once with `model_error`, after exactly one attempt.
"""

from __future__ import annotations

import httpx
import pytest

from roundtrip._kernel.wire.events import Outcome

ONE_CALL = {"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


async def test_a_turn_refused_with_429_waits_for_capacity_and_ends_end_turn(client, fleet_settings):
    settings = fleet_settings[0]
    async with httpx.AsyncClient(
        base_url=settings.model_base_url, timeout=10, headers={"x-api-key": "simulator"}
    ) as simulator:
        await simulator.post("/v1/_limits", json={"rpm": 1})  # a bucket of one request ...
        assert (await simulator.post("/v1/messages", json=ONE_CALL)).status_code == 200  # ... taken
        refused = (await simulator.post("/v1/_limits", json={"rpm": 30})).json()["refused"]  # empty; one more every 2 s
        try:
            request_id = await client.ask("where is my order?", customer="cus_1001", persona="careful")
            reply = await client.reply(request_id, timeout=90)
            after = (await simulator.get("/v1/_limits")).json()["refused"]
        finally:
            await simulator.post("/v1/_limits", json={"rpm": None})
            await simulator.post(
                "/v1/messages", json=ONE_CALL
            )  # an answer without limits: the model service forgets them
    assert after > refused  # its first call met a 429
    assert reply.outcome is Outcome.END_TURN and reply.steps == 3, reply


@pytest.mark.parametrize("status", [400, 401])
async def test_an_error_not_about_capacity_ends_the_turn_at_once_with_model_error(client, fleet_settings, status):
    settings = fleet_settings[0]
    async with httpx.AsyncClient(base_url=settings.model_base_url, timeout=10) as simulator:
        answered = (await simulator.post("/v1/_overload", json={"seconds": 120, "status": status})).json()["overloaded"]
        try:
            request_id = await client.ask("where is my order?", customer="cus_1001", persona="careful")
            reply = await client.reply(request_id, timeout=60)
        finally:
            answered = (await simulator.post("/v1/_overload", json={"seconds": 0})).json()["overloaded"] - answered
    assert reply.outcome is Outcome.MODEL_ERROR and reply.steps == 1, reply
    assert answered == 1  # one attempt: never retried
