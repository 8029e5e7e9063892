"""A platform's throttle is "later", never "fail" (issue 43, item 2): the fleet as processes, its model service on
Amazon Bedrock (the SDK's AsyncAnthropicBedrock) against the simulator in Bedrock's shape, whose throttle is a 429
ThrottlingException with no retry-after and no `anthropic-ratelimit-*` header. Its calls meet those 429s and the turn
still ends `end_turn`, not `model_error`: the limiter learns from the 429s alone (services/_model/capacity.py).
"""

from __future__ import annotations

import httpx

from roundtrip._kernel.wire.events import Outcome
from tests.e2e.test_model_providers_e2e import _platform_calls, model_on, platform_env

ONE_CALL = {"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


async def test_a_turn_throttled_on_bedrock_without_headers_waits_and_ends_end_turn(client, fleet, fleet_settings):
    settings = fleet_settings[0]
    async with (
        model_on(fleet, platform_env(settings, "bedrock")),
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{settings.simulator_port}", timeout=10, headers={"x-api-key": "simulator"}
        ) as simulator,
    ):
        before = await _platform_calls(settings, "bedrock")
        await simulator.post("/v1/_limits", json={"rpm": 1})  # a bucket of one request (shared by every shape) ...
        assert (await simulator.post("/v1/messages", json=ONE_CALL)).status_code == 200  # ... taken
        refused = (await simulator.post("/v1/_limits", json={"rpm": 20})).json()["refused"]  # empty; one every 3 s
        try:
            request_id = await client.ask("where is my order?", customer="cus_1001", persona="careful")
            reply = await client.reply(request_id, timeout=120)
            after = (await simulator.get("/v1/_limits")).json()["refused"]
        finally:
            await simulator.post("/v1/_limits", json={"rpm": None})
        answered = await _platform_calls(settings, "bedrock") - before
    assert after - refused >= 1  # its calls met Bedrock's throttle ...
    assert reply.outcome is Outcome.END_TURN and reply.steps == 3, reply  # ... and waited it out
    assert answered >= 3  # answered in Bedrock's shape
