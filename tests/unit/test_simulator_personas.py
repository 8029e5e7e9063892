"""The simulator's pure parts without HTTP: intents, personas, validation, usage."""

from __future__ import annotations

import json

import pytest

from roundtrip._kernel.clock import SYSTEM
from roundtrip._simulator import personas
from roundtrip._simulator.engine import respond
from roundtrip._simulator.errors import ApiError
from roundtrip._simulator.transcript import Transcript, intent_of
from roundtrip._simulator.usage import PromptCache
from roundtrip._simulator.validation import validate_count_tokens, validate_create
from tests.clocks import showing

TOOLS = [
    {"name": n, "input_schema": {"type": "object"}}
    for n in (
        "list_orders",
        "lookup_order",
        "cancel_order",
        "get_shipping_status",
        "search_help_center",
        "escalate_to_human",
    )
]


def body(*messages: dict, **extra) -> dict:
    return {"model": "claude-sonnet-4-6", "max_tokens": 1024, "tools": TOOLS, "messages": list(messages), **extra}


def user(content) -> dict:
    return {"role": "user", "content": content}


def step(calls: list[tuple[str, dict]], results: list[tuple[object, bool]], n: int = 0) -> list[dict]:
    """An assistant tool_use message and the user message answering it."""
    uses = [
        {"type": "tool_use", "id": f"toolu_{n}_{i}", "name": name, "input": args}
        for i, (name, args) in enumerate(calls)
    ]
    answers = [
        {
            "type": "tool_result",
            "tool_use_id": use["id"],
            "content": r if isinstance(r, str) else json.dumps(r),
            "is_error": err,
        }
        for use, (r, err) in zip(uses, results, strict=True)
    ]
    return [{"role": "assistant", "content": uses}, user(answers)]


def decide(persona: str, request: dict):
    validate_create(request)
    return personas.PERSONAS[persona](Transcript.from_request(request))


@pytest.mark.parametrize(
    ("text", "intent"),
    [
        ("Please CANCEL my order", "cancel"),
        ("Where is my parcel?", "track"),
        ("has it shipped yet", "track"),
        ("What's your refund policy", "help"),
        ("How do returns work?", "help"),
        ("Let me talk to a human", "human"),
        ("Show me my orders", "list"),  # "show" is not "how"
        ("hello", "list"),
    ],
)
def test_intent(text, intent):
    assert intent_of(text) == intent


def test_careful_explains_when_nothing_is_cancellable():
    orders = {"orders": [{"order_id": "ord_00000001", "status": "delivered", "placed_at": "2025-01-01"}]}
    reply = decide("careful", body(user("cancel please"), *step([("list_orders", {})], [(orders, False)])))
    assert reply.content[0]["type"] == "text" and "ord_00000001" in reply.content[0]["text"]


def test_careful_apologises_on_a_tool_error():
    reply = decide(
        "careful",
        body(user("cancel please"), *step([("list_orders", {})], [("The order service is unavailable.", True)])),
    )
    assert "sorry" in reply.content[0]["text"].lower() and "unavailable" in reply.content[0]["text"]


def test_sloppy_moves_on_when_a_draft_succeeds():
    orders = {"orders": [{"order_id": "ord_000000aa", "status": "pending", "placed_at": "2025-01-01"}]}
    reply = decide(
        "sloppy", body(user("cancel please"), *step([("list_orders", {"limit": "five"})], [(orders, False)]))
    )
    assert reply.content == [
        {"type": "tool_use", "name": "cancel_order", "input": {"order_id": "ord_000000aa", "reason": "changed_my_mind"}}
    ]


def test_sloppy_gives_up_when_the_correction_fails_too():
    history = [
        *step([("list_orders", {"limit": "five"})], [("limit must be an integer", True)], 0),
        *step([("list_orders", {"limit": 5})], [("service down", True)], 1),
    ]
    reply = decide("sloppy", body(user("cancel please"), *history))
    assert reply.content[0]["type"] == "text" and "sorry" in reply.content[0]["text"].lower()


def test_sloppy_help_and_human_drafts():
    assert decide("sloppy", body(user("how do refunds work"))).content[0]["input"] == {"q": "how do refunds work"}
    assert decide("sloppy", body(user("get me a human"))).content[0]["input"]["urgency"] == "urgent"


def test_mix_is_stable_and_spread():
    picks = {personas.resolve("mix", f"customer message {i}") for i in range(50)}
    assert picks == set(personas.MIX)
    assert personas.resolve("mix", "same words") == personas.resolve("mix", "same words")
    with pytest.raises(KeyError):
        personas.resolve("nobody", "x")


def test_tool_result_content_as_text_blocks_and_a_later_turn():
    orders = {"orders": [{"order_id": "ord_000000bb", "status": "processing", "placed_at": "2025-01-01"}]}
    first_turn = [user("hello"), {"role": "assistant", "content": "Hi! How can I help?"}]
    uses = [{"type": "tool_use", "id": "toolu_x", "name": "list_orders", "input": {}}]
    answer = [
        {"type": "tool_result", "tool_use_id": "toolu_x", "content": [{"type": "text", "text": json.dumps(orders)}]}
    ]
    request = body(*first_turn, user("cancel my order"), {"role": "assistant", "content": uses}, user(answer))
    reply = decide("careful", request)
    assert reply.content[0]["input"] == {"order_id": "ord_000000bb", "reason": "customer_request"}


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        (
            [user("x"), *step([("list_orders", {})], [("{}", False)])[:1], user([{"type": "text", "text": "hm"}])],
            "without `tool_result` blocks immediately after: toolu_0_0",
        ),
        (
            [
                user("x"),
                step([("list_orders", {})], [("{}", False)])[0],
                user(
                    [{"type": "text", "text": "first"}, step([("list_orders", {})], [("{}", False)])[1]["content"][0]]
                ),
            ],
            "must come first",
        ),
        (
            [user("x"), *step([("list_orders", {})], [("{}", False)]), *step([("list_orders", {})], [("{}", False)])],
            "must be unique",
        ),
        (
            [
                user("x"),
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "a", "input": "no"}]},
            ],
            "input",
        ),
        ([user([{"type": "tool_use", "id": "t", "name": "a", "input": {}}])], "not allowed in user messages"),
        ([user("")], "non-empty content"),
        ([user([{"type": "text", "text": ""}])], "text content blocks must be non-empty"),
    ],
)
def test_validation_messages(messages, fragment):
    with pytest.raises(ApiError) as caught:
        validate_create(body(*messages))
    assert caught.value.status == 400 and fragment in caught.value.message


def test_validation_of_tools_and_cache_breakpoints():
    with pytest.raises(ApiError, match="must define tools"):
        validate_create({**body(user("x"), *step([("a", {})], [("{}", False)])), "tools": None})
    with pytest.raises(ApiError, match="unique"):
        validate_create(body(user("x"), tools=TOOLS + TOOLS[:1]))
    with pytest.raises(ApiError, match=r"input_schema.type"):
        validate_create(body(user("x"), tools=[{"name": "a", "input_schema": {"type": "array"}}]))
    with pytest.raises(ApiError, match="maximum of 4 blocks"):
        cached = [{**t, "cache_control": {"type": "ephemeral"}} for t in TOOLS]
        validate_create(body(user("x"), tools=cached))
    with pytest.raises(ApiError, match="max_tokens: Extra inputs"):
        validate_count_tokens(body(user("x")))


def test_one_hour_cache_and_expiry():
    now = [0.0]
    cache = PromptCache(showing(now))
    system = [{"type": "text", "text": "a" * 8000, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    request = body(user("hello"), system=system)
    first = cache.input_usage(request)
    assert first["cache_creation"]["ephemeral_1h_input_tokens"] == first["cache_creation_input_tokens"] > 100
    now[0] = 3000.0
    assert cache.input_usage(request)["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    now[0] = 3000.0 + 3601
    assert cache.input_usage(request)["cache_creation_input_tokens"] > 0


def test_engine_cuts_at_stop_sequences_and_honours_tool_choice():
    cache = PromptCache(SYSTEM)
    message = respond(
        body(user("show my orders"), stop_sequences=["access", "zzz"], tool_choice={"type": "none"}), "careful", cache
    )
    assert message["stop_reason"] == "stop_sequence" and message["stop_sequence"] == "access"
    assert message["content"] == [{"type": "text", "text": "I'm sorry, I don't have "}]
    single = respond(
        body(user("refund?"), tool_choice={"type": "auto", "disable_parallel_tool_use": True}), "parallel", cache
    )
    assert [b["type"] for b in single["content"]] == ["tool_use"]
