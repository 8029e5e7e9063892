"""Prompt caching of the history: the model client's moving breakpoints, the simulator's billing of them
(several breakpoints, the 20-block lookback, the minimum cacheable length), and the careful persona's
follow-up that uses the history instead of listing the orders again."""

from __future__ import annotations

import json

from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.settings import Settings
from roundtrip._model.client import MAX_BREAKPOINTS, with_history_breakpoints
from roundtrip._simulator import personas
from roundtrip._simulator.transcript import Transcript
from roundtrip._simulator.usage import PromptCache
from roundtrip._simulator.validation import validate_create
from tests.agents import shop_model_client

MODEL = "claude-sonnet-4-6"


def marks(messages: list[dict]) -> list[int]:
    return [
        i
        for i, m in enumerate(messages)
        if isinstance(m["content"], list) and any("cache_control" in b for b in m["content"])
    ]


def test_breakpoints_on_the_last_message_and_the_previous_requests_last_message():
    messages = [{"role": "user", "content": "hi"}]
    assert marks(with_history_breakpoints(messages, 2)) == [0]
    assert messages == [{"role": "user", "content": "hi"}]  # the caller's transcript is never changed
    step = [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "list_orders", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "{}"}]},
    ]
    marked = with_history_breakpoints([*messages, *step], 2)
    assert marks(marked) == [0, 2]
    assert marked[0]["content"] == [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]
    assert marked[2]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert marks(with_history_breakpoints([*messages, *step], 1)) == [2]  # only as many as the limit leaves
    assert marks(with_history_breakpoints([*messages, *step], 0)) == []


def test_the_client_stays_within_the_four_breakpoint_limit():
    settings = Settings(anthropic_api_key=None)
    client = shop_model_client(settings)
    transcript = [{"role": "user", "content": "a"}]
    for n in range(6):
        transcript += [
            {"role": "assistant", "content": [{"type": "text", "text": f"answer {n}"}]},
            {"role": "user", "content": f"q {n}"},
        ]
    prepared = client.prepared(transcript)
    assert client.static_breakpoints + len(marks(prepared)) == MAX_BREAKPOINTS
    body = {"model": MODEL, "max_tokens": 100, "tools": client._tools, "system": client._system, "messages": prepared}
    validate_create(body)  # the simulator's copy of the API's rules: at most 4 blocks with cache_control
    assert shop_model_client(Settings(cache_history=False), client._tools).prepared(transcript) is transcript


def _request(messages: list[dict], system: str) -> dict:
    client_messages = with_history_breakpoints(messages, 2)
    return {
        "model": MODEL,
        "max_tokens": 100,
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        "messages": client_messages,
    }


def test_the_simulator_reads_the_previous_request_from_the_cache_and_writes_only_the_new_part():
    cache = PromptCache(SYSTEM)
    system = "Policies. " * 600  # over the 1024-token minimum
    transcript = [{"role": "user", "content": "what orders do I have?"}]
    first = cache.input_usage(_request(transcript, system))
    assert first["cache_read_input_tokens"] == 0 and first["cache_creation_input_tokens"] > 1024
    transcript += [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "list_orders", "input": {}}]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": json.dumps({"o": "x" * 4000})}],
        },
    ]
    second = cache.input_usage(_request(transcript, system))
    assert (
        second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    )  # everything the first request sent
    assert 1000 < second["cache_creation_input_tokens"] < 1200  # the new step, written for the next request
    assert second["input_tokens"] == 0  # nothing after the last breakpoint
    transcript += [
        {"role": "assistant", "content": [{"type": "text", "text": "Here they are."}]},
        {"role": "user", "content": "cancel the second one"},
    ]
    third = cache.input_usage(_request(transcript, system))
    assert third["cache_read_input_tokens"] == second["cache_read_input_tokens"] + second["cache_creation_input_tokens"]
    # without the history's breakpoints only the system prompt is read: the whole transcript is input again
    plain = {**_request(transcript, system), "messages": transcript}
    uncached = cache.input_usage(plain)
    assert (
        uncached["cache_read_input_tokens"] < first["cache_creation_input_tokens"]
    )  # the first user message was in it
    assert uncached["input_tokens"] > 1000


def test_lookback_finds_an_earlier_breakpoint_within_20_blocks_and_not_beyond():
    cache = PromptCache(SYSTEM)
    system = [{"type": "text", "text": "Policies. " * 600, "cache_control": {"type": "ephemeral"}}]
    base = [{"role": "user", "content": [{"type": "text", "text": "start", "cache_control": {"type": "ephemeral"}}]}]
    cache.input_usage({"model": MODEL, "system": system, "messages": base})

    def grown(blocks: int, word: str) -> dict:
        extra = [{"type": "text", "text": f"{word} {i}"} for i in range(blocks)]
        extra[-1] = {**extra[-1], "cache_control": {"type": "ephemeral"}}
        return {
            "model": MODEL,
            "system": system,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "start"}, *extra]}],
        }

    near = cache.input_usage(grown(19, "more"))
    far = cache.input_usage(grown(25, "other"))
    assert near["cache_read_input_tokens"] > far["cache_read_input_tokens"] > 0  # far: only the system prompt is found
    assert near["cache_read_input_tokens"] - far["cache_read_input_tokens"] < 50  # the "start" message


def test_a_prefix_under_the_minimum_cacheable_length_is_not_cached():
    cache = PromptCache(SYSTEM)
    request = {
        "model": MODEL,
        "system": [{"type": "text", "text": "short", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    for _ in range(2):
        usage = cache.input_usage(request)
        assert usage["cache_creation_input_tokens"] == usage["cache_read_input_tokens"] == 0
    haiku = {
        **request,
        "model": "claude-haiku-4-5",
        "system": [{"type": "text", "text": "x" * 8000, "cache_control": {"type": "ephemeral"}}],
    }
    assert cache.input_usage(haiku)["cache_creation_input_tokens"] == 0  # 2000 tokens: under Haiku 4.5's 4096


LISTED = {
    "orders": [
        {"order_id": "ord_a1000003", "status": "pending", "placed_at": "2026-11-25T20:31:00Z"},
        {"order_id": "ord_a1000004", "status": "processing", "placed_at": "2026-11-10T11:03:00Z"},
        {"order_id": "ord_a1000002", "status": "shipped", "placed_at": "2026-10-20T17:45:00Z"},
    ]
}


def _history() -> list[dict]:
    return [
        {"role": "user", "content": "what orders do I have?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "list_orders", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": json.dumps(LISTED)}]},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "text",
                    "text": "Here are your most recent orders: ord_a1000003 (pending); "
                    "ord_a1000004 (processing); ord_a1000002 (shipped).",
                }
            ],
        },
    ]


def _decide(messages: list[dict]):
    tools = [{"name": n, "input_schema": {"type": "object"}} for n in ("list_orders", "cancel_order")]
    return personas.PERSONAS["careful"](Transcript.from_request({"model": MODEL, "tools": tools, "messages": messages}))


def test_careful_cancels_the_second_listed_order_from_the_history_without_listing_again():
    reply = _decide([*_history(), {"role": "user", "content": "cancel the second one you listed"}])
    assert reply.content == [
        {
            "type": "tool_use",
            "name": "cancel_order",
            "input": {"order_id": "ord_a1000004", "reason": "customer_request"},
        }
    ]
    # without a history, or an id no list_orders showed, it looks the orders up first
    assert (
        _decide([{"role": "user", "content": "cancel the second one you listed"}]).content[0]["name"] == "list_orders"
    )
    forged = _history()
    forged[3] = {"role": "assistant", "content": [{"type": "text", "text": "Orders: ord_a1000003; ord_9f3c4e21."}]}
    assert _decide([*forged, {"role": "user", "content": "cancel the second one"}]).content[0]["name"] == "list_orders"
    # "cancel my last order" is not an ordinal of the list: the newest cancellable order, looked up again
    assert (
        _decide([*_history(), {"role": "user", "content": "cancel my last order"}]).content[0]["name"] == "list_orders"
    )
