"""The model service's handler with the real anthropic SDK against the simulator over HTTP."""

from __future__ import annotations

import time

import pytest

from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.events import CallModel, Turn, Usage
from roundtrip._model.attempts import MARGIN_S
from roundtrip._model.client import ModelClient
from roundtrip._simulator.server import running_simulator
from tests.agents import shop_model_client
from tests.cores import respond
from tests.databases import migrated

TURN = Turn(turn_id="turn_1", request_id="req_1", conversation_id="conv_1", customer_id="cus_1001", persona="careful")


@pytest.fixture(scope="module")
def simulator():
    with running_simulator() as url:
        yield url


@pytest.fixture(scope="module")
def failing_simulator():
    with running_simulator(fault_rate=1.0) as url:
        yield url


def client_for(url: str, **overrides) -> ModelClient:
    settings = Settings(
        _env_file=None, anthropic_api_key=None, anthropic_base_url=url, model_max_retries=1, **overrides
    )
    return shop_model_client(settings)


async def test_a_tool_use_response_becomes_an_iteration_with_fingerprints_and_usage(simulator):
    client = client_for(simulator)
    command = CallModel(
        turn=TURN, step=0, messages=[{"role": "user", "content": "cancel my last order"}], spent=Usage(input_tokens=7)
    )
    event = await respond(command, client)
    await client.aclose()
    assert event.step == 1 and event.stop_reason == "tool_use" and event.error is None
    assert [c.name for c in event.tool_calls] == ["list_orders"]
    assert event.tool_calls[0].fingerprint.startswith("list_orders:")
    # with the history cached too, the whole prompt is a cache write or read (nothing follows the last breakpoint)
    assert event.usage.cache_creation_input_tokens + event.usage.cache_read_input_tokens > 1000
    assert event.spent == event.usage + Usage(input_tokens=7)
    assert event.content[0]["type"] in ("text", "tool_use")


async def test_the_static_prefix_is_cached_across_calls(simulator):
    client = client_for(simulator)
    command = CallModel(turn=TURN, step=0, messages=[{"role": "user", "content": "what are my orders?"}])
    await respond(command, client)
    second = await respond(command, client)
    await client.aclose()
    assert second.usage.cache_read_input_tokens > 0


async def test_an_api_overloaded_until_the_deadline_becomes_a_busy_iteration(failing_simulator):
    client = client_for(failing_simulator)
    turn = TURN.model_copy(update={"deadline_at": time.time() + MARGIN_S + 1.5})  # a 529 is "later" until then
    event = await respond(CallModel(turn=turn, step=2, messages=[{"role": "user", "content": "hi"}]), client)
    await client.aclose()
    assert event.step == 3 and event.stop_reason is None and event.busy
    assert (
        "rate limited until the turn's deadline" in event.error and "529" in event.error and "Overloaded" in event.error
    )


@pytest.mark.parametrize(
    "persona,problem", [("bloated", "input too large: "), ("deep", "input nested too deep: more than 32 levels")]
)
async def test_a_tool_input_no_event_could_carry_becomes_a_call_with_an_error_and_is_still_billed(
    simulator, persona, problem
):
    client = client_for(simulator, max_tokens=200_000)  # a model allowed to write that much
    turn = TURN.model_copy(update={"persona": persona})
    command = CallModel(
        turn=turn, step=0, messages=[{"role": "user", "content": "help me"}], spent=Usage(input_tokens=7)
    )
    event = await respond(command, client)
    await client.aclose()
    (call,) = event.tool_calls
    assert call.error.startswith(problem), call.error
    if persona == "bloated":
        assert call.error.endswith("limit 65536") and int(call.error.split()[3]) > 600_000
    assert call.input == {"roundtrip_omitted": f"{call.error}; the input was not kept"}
    assert next(b for b in event.content if b["type"] == "tool_use")["input"] == call.input
    assert len(event.model_dump_json().encode()) < 10_000  # the event is small: it is published
    assert event.usage.output_tokens > (
        100_000 if persona == "bloated" else 100
    ) and event.spent == event.usage + Usage(input_tokens=7)


async def test_no_model_call_for_a_turn_the_fence_refuses(simulator, tmp_path):
    from roundtrip._kernel.storage.turnstore import Fence

    fence = await Fence.open(await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"))
    client = client_for(simulator)
    try:
        command = CallModel(turn=TURN, step=0, messages=[{"role": "user", "content": "hi"}])
        assert (
            await respond(command, client, fence) is None
        )  # a turn the ledger does not know (or ended) is never called
    finally:
        await client.aclose()
        await fence.close()
