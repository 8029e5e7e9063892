"""The simulator streams like the Messages API (`"stream": true`), over real HTTP, read by the real anthropic SDK's
streaming client: the events in the API's order, and the message they add up to the one a plain call gets, for every
persona and for scripted mode, over whole tool-use turns."""

from __future__ import annotations

import json
import re
import time

import anthropic
import httpx
import pytest

from roundtrip._simulator import running_simulator
from roundtrip._simulator.personas import PERSONAS
from roundtrip._simulator.scripted import Scripts, parse_script
from tests.unit.test_simulator import MODEL, SYSTEM, TOOLS, fake_tool

SCRIPT = [
    [{"type": "text", "text": "Let me look that up."}, {"type": "tool_use", "name": "lookup_order", "input": {}}],
    {"content": [{"type": "text", "text": "Your order  is on its way.\n"}], "stop_reason": "end_turn"},
]
ORDER = re.compile(
    r"message_start content_block_start ping (content_block_delta )*content_block_stop "
    r"(content_block_start (content_block_delta )*content_block_stop )*message_delta message_stop"
)


@pytest.fixture(scope="module")
def base_url():
    with running_simulator(scripts=Scripts({"two": parse_script("two", SCRIPT)})) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return anthropic.AsyncAnthropic(base_url=base_url, api_key="sim", max_retries=0)


def _request(messages: list[dict], persona: str) -> dict:
    return dict(
        model=MODEL,
        max_tokens=1024,
        system=SYSTEM,
        tools=TOOLS,
        messages=messages,
        extra_headers={"x-roundtrip-persona": persona},
    )


async def _streamed(client: anthropic.AsyncAnthropic, request: dict) -> tuple[anthropic.types.Message, str]:
    async with client.messages.stream(**request) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        return await stream.get_final_message(), text


async def _raw(client: anthropic.AsyncAnthropic, request: dict) -> tuple[anthropic.types.Message, str]:
    """The stream's raw events added up by hand: the SDK's helper parses a tool input at every piece with a nesting
    limit below what the `deep` persona writes (600 levels), so it refuses that stream, which the API would send."""
    message, blocks, parts = {}, [], {}
    async for event in await client.messages.create(**request, stream=True):
        if event.type == "message_start":
            message = event.message.model_dump(mode="json", exclude_none=True)
        elif event.type == "content_block_start":
            blocks.append(event.content_block.model_dump(mode="json", exclude_none=True))
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            blocks[event.index]["text"] += event.delta.text
        elif event.type == "content_block_delta":
            parts[event.index] = parts.get(event.index, "") + event.delta.partial_json
        elif event.type == "content_block_stop" and event.index in parts:
            blocks[event.index]["input"] = json.loads(parts[event.index])
        elif event.type == "message_delta":
            message.update(
                event.delta.model_dump(mode="json"), usage=event.usage.model_dump(mode="json", exclude_none=True)
            )
    message["content"] = blocks
    text = "".join(b.get("text", "") for b in blocks)
    return anthropic.types.Message.model_validate(message), text


def _block(block) -> dict:
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    return {"type": "text", "text": block.text}


def _shape(message: anthropic.types.Message) -> tuple:
    """All of a message, compared without pydantic's dump (which refuses the `deep` persona's 600 levels)."""
    blocks = [
        (b.type, getattr(b, "text", None), getattr(b, "id", None), getattr(b, "name", None)) for b in message.content
    ]
    inputs = [b.input for b in message.content if b.type == "tool_use"]
    head = (message.id, message.model, message.role, message.stop_reason, message.stop_sequence)
    return head, message.usage.model_dump(), blocks, inputs


@pytest.mark.parametrize("persona", [*PERSONAS, "script:two"])
async def test_a_streamed_turn_is_the_plain_turn_for_every_persona_and_a_script(client, persona):
    """Each step streamed: its text as it arrives is the message's text, and the message equals a plain call's."""
    messages: list[dict] = [{"role": "user", "content": "Please cancel my order ord_5e6f7a8b, it is late"}]
    for _ in range(8):
        plain = await client.messages.create(**_request(messages, persona))
        streamed, text = await (_raw if persona == "deep" else _streamed)(client, _request(messages, persona))
        assert _shape(streamed) == _shape(plain)
        assert text == "".join(b.text for b in streamed.content if b.type == "text")
        if streamed.stop_reason != "tool_use":
            return
        messages.append({"role": "assistant", "content": [_block(b) for b in streamed.content]})
        results = []
        for block in (b for b in streamed.content if b.type == "tool_use"):
            try:
                result, is_error = fake_tool(block.name, block.input)
            except TypeError:  # the `deep` persona's input (the fleet replaces it by a marker)
                result, is_error = "Invalid input: too deep", True
            content = result if isinstance(result, str) else json.dumps(result)
            results.append({"type": "tool_result", "tool_use_id": block.id, "content": content, "is_error": is_error})
        messages.append({"role": "user", "content": results})


async def test_the_events_come_in_the_apis_order_with_the_usage_at_the_start_and_the_end(client):
    raw = await client.messages.create(
        **_request([{"role": "user", "content": "where is my order?"}], "careful"), stream=True
    )
    events = [event async for event in raw]  # the SDK passes on every event but the ping
    assert ORDER.fullmatch(
        " ".join(e.type for e in events).replace("content_block_start", "content_block_start ping", 1)
    )
    start, delta = events[0], events[-2]
    assert start.message.content == [] and start.message.stop_reason is None and start.message.usage.input_tokens > 0
    assert delta.delta.stop_reason == "tool_use" and delta.usage.output_tokens > 1
    tool_deltas = [
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(tool_deltas) > 1  # the input arrives in pieces, as the API sends it


async def test_the_wire_carries_server_sent_events_with_one_ping_after_the_first_block_starts(base_url):
    body = _request([{"role": "user", "content": "Please cancel my order"}], "script:two")
    headers = {"x-api-key": "sim", **body.pop("extra_headers")}
    async with (
        httpx.AsyncClient(base_url=base_url) as http,
        http.stream("POST", "/v1/messages", json={**body, "stream": True}, headers=headers) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in response.aiter_lines()]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert ORDER.fullmatch(" ".join(names)) and names.count("ping") == 1
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in data] == names  # each event's data names its event


async def test_the_latency_is_spread_over_the_stream_so_the_first_text_comes_early(client):
    request = _request([{"role": "user", "content": "Please cancel my order"}], "script:two")
    request["extra_headers"]["x-roundtrip-latency-ms"] = "600"
    started = time.monotonic()
    async with client.messages.stream(**request) as stream:
        async for _ in stream.text_stream:
            first = time.monotonic() - started
            break
        await stream.get_final_message()
    whole = time.monotonic() - started
    assert first < whole and whole >= 0.55  # the whole latency still passes before the message is complete


async def test_a_stream_overloaded_midway_raises_the_sdks_overloaded_error_after_some_text(client):
    request = _request([{"role": "user", "content": "Please cancel my order"}], "script:two")
    request["extra_headers"]["x-roundtrip-fault"] = "529-midstream"
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as raised:
        async with client.messages.stream(**request) as stream:
            async for piece in stream.text_stream:
                seen.append(piece)
    assert seen and "".join(seen) != "Let me look that up."
    assert "overloaded_error" in str(raised.value)


async def test_a_plain_request_with_the_midstream_fault_gets_a_529(client):
    request = _request([{"role": "user", "content": "hi"}], "careful")
    request["extra_headers"]["x-roundtrip-fault"] = "529-midstream"
    with pytest.raises(anthropic.APIStatusError) as raised:
        await client.messages.create(**request)
    assert raised.value.status_code == 529
