"""The simulator over real HTTP, driven by the real anthropic SDK and a hand-written tool loop."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import anthropic
import httpx
import pytest

from roundtrip._simulator import running_simulator
from roundtrip._simulator.engine import NO_TOOLS_TEXT
from roundtrip._simulator.usage import estimate_tokens, prompt_of

MODEL = "claude-sonnet-4-6"


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "name": name,
        "description": description,
        "input_schema": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
    }


ORDER_ID = {"type": "string", "pattern": "^ord_[0-9a-f]{8}$"}
TOOLS = [
    _tool(
        "list_orders",
        "List the customer's orders, newest first.",
        {"status": {"type": "string"}, "limit": {"type": "integer"}},
        [],
    ),
    _tool("lookup_order", "Look up one order.", {"order_id": ORDER_ID}, ["order_id"]),
    _tool(
        "cancel_order",
        "Cancel a pending or processing order.",
        {
            "order_id": ORDER_ID,
            "reason": {"enum": ["customer_request", "duplicate_order", "wrong_item", "delivery_too_slow", "other"]},
        },
        ["order_id", "reason"],
    ),
    _tool("get_shipping_status", "Shipping status of an order.", {"order_id": ORDER_ID}, ["order_id"]),
    _tool("search_help_center", "Search help articles.", {"query": {"type": "string"}}, ["query"]),
    _tool(
        "escalate_to_human",
        "Hand over to a person.",
        {"summary": {"type": "string"}, "urgency": {"enum": ["low", "normal", "high"]}},
        ["summary", "urgency"],
    ),
]
SYSTEM = "You are the support agent of a small shop. Be polite."

# The customer's orders, newest first: the newest is shipped, the next one can be cancelled.
ORDERS = [
    {"order_id": "ord_1a2b3c4d", "status": "shipped", "placed_at": "2025-03-03T10:00:00Z", "total": "19.90"},
    {"order_id": "ord_5e6f7a8b", "status": "processing", "placed_at": "2025-03-02T10:00:00Z", "total": "5.00"},
    {"order_id": "ord_0c0c0c0c", "status": "delivered", "placed_at": "2025-03-01T10:00:00Z", "total": "7.50"},
]
REASONS = ("customer_request", "duplicate_order", "wrong_item", "delivery_too_slow", "other")


def fake_tool(name: str, args: dict) -> tuple[Any, bool]:
    """A tiny stand-in for gate + executor: (result, is_error)."""
    mine = {o["order_id"]: o for o in ORDERS}
    if name == "list_orders":
        if "limit" in args and not isinstance(args["limit"], int):
            return f"Invalid input for list_orders: {args['limit']!r} is not of type 'integer' (limit).", True
        return {"orders": ORDERS[: args.get("limit", 10)]}, False
    if name in ("lookup_order", "get_shipping_status", "cancel_order") and args.get("order_id") not in mine:
        return f"Order {args.get('order_id')} was not found for this customer.", True
    if name == "lookup_order":
        return mine[args["order_id"]], False
    if name == "get_shipping_status":
        return {
            "order_id": args["order_id"],
            "status": "in_transit",
            "carrier": "DHL",
            "tracking_number": "JD0001",
        }, False
    if name == "cancel_order":
        if args.get("reason") not in REASONS:
            return (
                f"Invalid input for cancel_order: {args.get('reason')!r} is not one of {list(REASONS)} (reason).",
                True,
            )
        return {"order_id": args["order_id"], "status": "cancelled"}, False
    if name == "search_help_center":
        if "query" not in args:
            return "Invalid input for search_help_center: 'query' is a required property.", True
        return {"articles": [{"title": f"About {args['query']}", "url": "https://help.example/1"}]}, False
    if name == "escalate_to_human":
        return {"ticket_id": "esc_00000042"}, False
    return f"Unknown tool {name}", True


async def run_turn(
    client: anthropic.AsyncAnthropic, text: str, persona: str, max_steps: int = 12, **create: Any
) -> tuple[list[anthropic.types.Message], list[dict]]:
    """The tool-use loop: call, execute every tool_use, send all results back in one user message."""
    messages: list[dict] = [{"role": "user", "content": text}]
    responses = []
    for _ in range(max_steps):
        message = await client.messages.create(
            model=MODEL,
            max_tokens=create.pop("max_tokens", 1024),
            system=SYSTEM,
            tools=TOOLS,
            messages=messages,
            extra_headers={"x-roundtrip-persona": persona},
            **create,
        )
        responses.append(message)
        if message.stop_reason != "tool_use":
            break
        # Replay the content as the SDK dumps it (nulls included), like a fleet would.
        messages.append({"role": "assistant", "content": [b.model_dump(mode="json") for b in message.content]})
        results = []
        for block in message.content:
            if block.type == "tool_use":
                result, is_error = fake_tool(block.name, block.input)
                text_result = result if isinstance(result, str) else json.dumps(result)
                results.append(
                    {"type": "tool_result", "tool_use_id": block.id, "content": text_result, "is_error": is_error}
                )
        messages.append({"role": "user", "content": results})
    return responses, messages


def tool_calls(message: anthropic.types.Message) -> list[tuple[str, dict]]:
    return [(b.name, b.input) for b in message.content if b.type == "tool_use"]


def final_text(message: anthropic.types.Message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


@pytest.fixture(scope="module")
def base_url():
    with running_simulator() as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return anthropic.AsyncAnthropic(base_url=base_url, api_key="sim", max_retries=0)


@pytest.fixture(scope="module")
async def http(base_url):
    async with httpx.AsyncClient(base_url=base_url, headers={"x-api-key": "sim"}) as client:
        yield client


# -- personas ----------------------------------------------------------------------------


async def test_careful_cancel_is_three_calls(client):
    responses, _ = await run_turn(client, "Please cancel my order", "careful")
    assert [r.stop_reason for r in responses] == ["tool_use", "tool_use", "end_turn"]
    assert tool_calls(responses[0]) == [("list_orders", {})]
    assert tool_calls(responses[1]) == [("cancel_order", {"order_id": "ord_5e6f7a8b", "reason": "customer_request"})]
    assert "I've cancelled order ord_5e6f7a8b" in final_text(responses[2])


async def test_careful_other_intents(client):
    responses, _ = await run_turn(client, "Where is my parcel?", "careful")
    assert tool_calls(responses[1]) == [("get_shipping_status", {"order_id": "ord_1a2b3c4d"})]
    assert "ord_1a2b3c4d" in final_text(responses[-1]) and "DHL" in final_text(responses[-1])
    responses, _ = await run_turn(client, "What is your refund policy?", "careful")
    assert tool_calls(responses[0])[0][0] == "search_help_center" and len(responses) == 2
    responses, _ = await run_turn(client, "I want to talk to a human", "careful")
    assert tool_calls(responses[0])[0][0] == "escalate_to_human" and "esc_00000042" in final_text(responses[-1])
    responses, _ = await run_turn(client, "Show me my orders", "careful")
    assert tool_calls(responses[0]) == [("list_orders", {})] and "ord_0c0c0c0c" in final_text(responses[-1])


async def test_careless_invents_the_incident_id_and_apologises(client):
    responses, _ = await run_turn(client, "cancel my order please", "careless")
    assert tool_calls(responses[0]) == [("cancel_order", {"order_id": "ord_9f3c4e21", "reason": "customer_request"})]
    assert len(responses) == 2 and responses[1].stop_reason == "end_turn"
    assert "sorry" in final_text(responses[1]).lower() and "ord_9f3c4e21" in final_text(responses[1])


async def test_sloppy_corrects_itself_after_errors(client):
    responses, _ = await run_turn(client, "Cancel my last order", "sloppy")
    assert [tool_calls(r) for r in responses[:4]] == [
        [("list_orders", {"limit": "five"})],
        [("list_orders", {"limit": 5})],
        [("cancel_order", {"order_id": "ord_5e6f7a8b", "reason": "changed_my_mind"})],
        [("cancel_order", {"order_id": "ord_5e6f7a8b", "reason": "customer_request"})],
    ]
    assert responses[4].stop_reason == "end_turn" and "ord_5e6f7a8b" in final_text(responses[4])


async def test_parallel_emits_several_tool_uses_in_one_response(client):
    responses, _ = await run_turn(client, "cancel an order", "parallel")
    assert [name for name, _ in tool_calls(responses[0])] == ["list_orders", "search_help_center"]
    assert responses[1].content[0].type == "tool_use" and len(responses) == 3
    responses, _ = await run_turn(client, "where are my orders?", "parallel")
    assert tool_calls(responses[1]) == [("get_shipping_status", {"order_id": o["order_id"]}) for o in ORDERS]
    assert all(o["order_id"] in final_text(responses[2]) for o in ORDERS)


@pytest.mark.parametrize("persona", ["stubborn", "looping", "flailing"])
async def test_runaway_personas_never_stop_by_themselves(client, persona):
    responses, _ = await run_turn(client, "Where is my order?", persona, max_steps=12)
    assert len(responses) == 12 and all(r.stop_reason == "tool_use" for r in responses)
    calls = [tool_calls(r)[0] for r in responses]
    if persona == "stubborn":
        assert set(json.dumps(c) for c in calls) == {json.dumps(("lookup_order", {"order_id": "ord_0000dead"}))}
    elif persona == "looping":
        assert [c[0] for c in calls[:4]] == ["lookup_order", "get_shipping_status"] * 2
    else:
        assert len({c[1]["order_id"] for c in calls}) == 12 and calls[0][1]["order_id"] == "ord_0000de01"


async def test_refusing_and_terse(client):
    message = await client.messages.create(
        model=MODEL,
        max_tokens=50,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-roundtrip-persona": "refusing"},
    )
    assert message.stop_reason == "refusal" and message.content == []
    message = await client.messages.create(
        model=MODEL,
        max_tokens=50,
        stop_sequences=["###", "END"],
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-roundtrip-persona": "terse"},
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "###"


async def test_only_offered_tools_are_called(client):
    message = await client.messages.create(
        model=MODEL,
        max_tokens=200,
        tools=[t for t in TOOLS if t["name"] != "cancel_order"],
        messages=[{"role": "user", "content": "cancel my order"}],
        extra_headers={"x-roundtrip-persona": "careless"},
    )
    assert message.stop_reason == "end_turn" and final_text(message) == NO_TOOLS_TEXT


# -- protocol ----------------------------------------------------------------------------


async def test_same_request_gives_the_same_body(http):
    body = {"model": MODEL, "max_tokens": 300, "tools": TOOLS, "messages": [{"role": "user", "content": "cancel it"}]}
    headers = {"x-roundtrip-persona": "mix"}
    first = await http.post("/v1/messages", json=body, headers=headers)
    second = await http.post("/v1/messages", json=body, headers=headers)
    assert first.status_code == 200 and first.content == second.content
    message = first.json()
    assert message["id"].startswith("msg_") and message["type"] == "message" and message["role"] == "assistant"
    tool_use = next(b for b in message["content"] if b["type"] == "tool_use")
    assert tool_use["id"].startswith("toolu_") and len(tool_use["id"]) == len("toolu_") + 24


async def test_prompt_cache_creation_then_read(client):
    # over the minimum cacheable length of the model (1024 tokens for Sonnet): a prefix shorter is not cached
    system = [
        {
            "type": "text",
            "text": f"{SYSTEM} Run {uuid.uuid4()}. " + "Our policies apply. " * 250,
            "cache_control": {"type": "ephemeral"},
        }
    ]
    tools = [*TOOLS[:-1], {**TOOLS[-1], "cache_control": {"type": "ephemeral"}}]
    usages = []
    for text in ("cancel my order", "where is my order"):
        message = await client.messages.create(
            model=MODEL, max_tokens=200, system=system, tools=tools, messages=[{"role": "user", "content": text}]
        )
        usages.append(message.usage)
    assert usages[0].cache_creation_input_tokens > 0 and usages[0].cache_read_input_tokens == 0
    assert (
        usages[1].cache_read_input_tokens == usages[0].cache_creation_input_tokens
        and usages[1].cache_creation_input_tokens == 0
    )
    assert 0 < usages[1].input_tokens < usages[1].cache_read_input_tokens
    total = estimate_tokens(
        prompt_of({"tools": tools, "system": system, "messages": [{"role": "user", "content": "cancel my order"}]})
    )
    assert usages[0].input_tokens + usages[0].cache_creation_input_tokens == total
    assert usages[0].output_tokens > 0


async def test_count_tokens(client):
    messages = [{"role": "user", "content": "cancel my order"}]
    counted = await client.messages.count_tokens(model=MODEL, system=SYSTEM, tools=TOOLS, messages=messages)
    assert counted.input_tokens == estimate_tokens(prompt_of({"tools": TOOLS, "system": SYSTEM, "messages": messages}))


async def test_max_tokens_truncates(client):
    message = await client.messages.create(
        model=MODEL,
        max_tokens=5,
        messages=[{"role": "user", "content": "hello"}],
        extra_headers={"x-roundtrip-persona": "terse"},
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 5
    assert final_text(message) == "Thanks for reaching out, we're on it."[:20]
    # a tool_use that does not fit is dropped, never sent half-written
    responses, _ = await run_turn(client, "show my orders", "careful", max_steps=1, max_tokens=3)
    assert responses[0].stop_reason == "max_tokens" and responses[0].content == []


async def test_unanswered_tool_use_is_a_400(client):
    first = await client.messages.create(
        model=MODEL, max_tokens=200, tools=TOOLS, messages=[{"role": "user", "content": "cancel"}]
    )
    tool_id = first.content[0].id
    history = [
        {"role": "user", "content": "cancel"},
        {"role": "assistant", "content": [b.model_dump(mode="json") for b in first.content]},
    ]
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(
            model=MODEL, max_tokens=200, tools=TOOLS, messages=[*history, {"role": "user", "content": "well?"}]
        )
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "without `tool_result` blocks" in caught.value.message and tool_id in caught.value.message
    wrong = {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "{}"}
    with pytest.raises(anthropic.BadRequestError, match="unexpected `tool_use_id`"):
        await client.messages.create(
            model=MODEL, max_tokens=200, tools=TOOLS, messages=[*history, {"role": "user", "content": [wrong]}]
        )
    with pytest.raises(anthropic.BadRequestError, match="roles must alternate"):
        await client.messages.create(
            model=MODEL, max_tokens=200, messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        )


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, "max_tokens: Field required"),
        (
            {"model": MODEL, "max_tokens": "9", "messages": [{"role": "user", "content": "x"}]},
            "max_tokens: Input should be a valid integer",
        ),
        (
            {"model": MODEL, "max_tokens": 9, "messages": [{"role": "user", "content": "x"}], "stream": "yes"},
            "stream: Input should be a valid boolean",
        ),
        ({"model": MODEL, "max_tokens": 9, "messages": [{"role": "assistant", "content": "x"}]}, "first message"),
        ({"model": MODEL, "max_tokens": 9, "messages": [], "tools": TOOLS}, "at least 1 item"),
        (
            {"model": MODEL, "max_tokens": 9, "messages": [{"role": "user", "content": "x"}], "temprature": 1},
            "temprature: Extra inputs",
        ),
        ({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}, "model: Field required"),
    ],
)
async def test_invalid_requests(http, body, fragment):
    response = await http.post("/v1/messages", json=body)
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert fragment in error["error"]["message"]


async def test_unknown_model_persona_route_and_missing_key(http, client):
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.create(model="gpt-4", max_tokens=9, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError, match="unknown simulator persona"):
        await client.messages.create(
            model=MODEL,
            max_tokens=9,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-roundtrip-persona": "nope"},
        )
    missing = await http.post("/v1/messages", json={}, headers={"x-api-key": ""})
    nowhere = await http.get("/v1/nowhere")
    health = await http.get("/health")
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    assert nowhere.status_code == 404 and nowhere.json()["error"]["type"] == "not_found_error"
    assert health.json()["status"] == "ok" and "stubborn" in health.json()["personas"]


def test_accepted_parameters_match_the_sdk():
    from anthropic.types import message_count_tokens_params, message_create_params

    from roundtrip._simulator.validation import COUNT_TOKENS_PARAMS, CREATE_PARAMS

    assert set(message_create_params.MessageCreateParamsBase.__annotations__) <= CREATE_PARAMS
    assert set(message_count_tokens_params.MessageCountTokensParams.__annotations__) == COUNT_TOKENS_PARAMS


# -- faults and latency ------------------------------------------------------------------


async def test_forced_529_is_retried_by_the_sdk(base_url):
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="sim", max_retries=2)
    response = await client.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=100,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-roundtrip-fault": "529", "x-roundtrip-fault-attempts": "1"},
    )
    assert response.retries_taken == 1 and (await response.parse()).stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("fault", "error"),
    [("529", anthropic.OverloadedError), ("429", anthropic.RateLimitError), ("500", anthropic.InternalServerError)],
)
async def test_forced_faults_raise_the_sdk_classes(client, fault, error):
    with pytest.raises(error) as caught:
        await client.messages.create(
            model=MODEL,
            max_tokens=9,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-roundtrip-fault": fault},
        )
    assert caught.value.body["type"] == "error"


async def test_timeout_fault(base_url):
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="sim", max_retries=0, timeout=0.3)
    with pytest.raises(anthropic.APITimeoutError):
        await client.messages.create(
            model=MODEL,
            max_tokens=9,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-roundtrip-fault": "timeout", "x-roundtrip-fault-delay": "2"},
        )


async def test_latency_header(client):
    started = time.monotonic()
    await client.messages.create(
        model=MODEL,
        max_tokens=9,
        messages=[{"role": "user", "content": "x"}],
        extra_headers={"x-roundtrip-latency-ms": "150"},
    )
    assert time.monotonic() - started >= 0.15


async def test_fault_rate_injects_529s():
    with running_simulator(fault_rate=1.0) as url:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sim", max_retries=0)
        with pytest.raises(anthropic.OverloadedError):
            await client.messages.create(model=MODEL, max_tokens=9, messages=[{"role": "user", "content": "x"}])
