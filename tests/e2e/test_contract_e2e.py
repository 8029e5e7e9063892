"""The public contract as a plain Kafka client meets it: what is tolerated, what is refused, and the answer."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome

REFUSAL_WAIT_S = 5.0  # a refusal needs no model call: it comes in milliseconds, this only bounds a busy machine


def _request(**fields) -> dict:
    tag = uuid.uuid4().hex[:8]
    return {
        "request_id": f"req_{tag}",
        "conversation_id": f"conv_{tag}",
        "customer_id": "cus_1002",
        "text": "what are my orders?",
        **fields,
    }


async def _publish(client, body: dict, key: bytes | None = None, keyed: bool = True) -> None:
    await client.publish_raw(
        json.dumps(body).encode(), key=(key or body["conversation_id"].encode()) if keyed else None
    )


def _letters_of(client, request_id: str) -> list[dict]:
    return [letter for letter in client.seen[topics.DEAD_LETTERS] if f'"{request_id}"' in letter["payload"]]


async def test_an_unknown_field_is_ignored_and_the_metadata_comes_back_in_the_reply_and_the_trace(
    client, fleet_settings
):
    body = _request(locale="de", metadata={"channel": "web", "tier": "gold", "tags": ["vip", 3]})
    await _publish(client, body)

    reply = await client.reply(body["request_id"])
    assert reply.outcome is Outcome.END_TURN and reply.reason is None
    assert reply.metadata == {"channel": "web", "tier": "gold", "tags": ["vip", 3]}
    assert not _letters_of(client, body["request_id"])

    span_file = fleet_settings[0].effective_span_file
    deadline = time.monotonic() + 15
    while not (
        turn_spans := [
            s
            for s in map(json.loads, filter(str.strip, span_file.read_text().splitlines()))
            if s["name"] == "invoke_agent support-agent" and s["trace_id"] == reply.trace_id
        ]
    ):
        assert time.monotonic() < deadline, "the turn span should be written"
        await asyncio.sleep(0.5)  # poll interval: the turn span written to the span file
    assert json.loads(turn_spans[0]["attributes"]["roundtrip.metadata"]) == reply.metadata


async def test_a_request_without_a_customer_is_answered_invalid_request_at_once_and_dead_lettered(client):
    body = _request()
    del body["customer_id"]
    started = time.monotonic()
    await _publish(client, body)

    reply = await client.reply(body["request_id"], timeout=REFUSAL_WAIT_S)
    print(f"invalid_request reply after {time.monotonic() - started:.3f} s")
    assert reply.outcome is Outcome.INVALID_REQUEST
    assert "customer_id" in reply.reason and "required" in reply.reason.lower()
    assert reply.conversation_id == body["conversation_id"] and reply.customer_id == "" and reply.turn_id == ""
    assert reply.steps == 0 and reply.cost_usd == 0.0 and reply.text
    letters = await client.wait_for(lambda: _letters_of(client, body["request_id"]), timeout=REFUSAL_WAIT_S)
    assert letters[0]["service"] == "gateway" and "customer_id" in letters[0]["reason"]


async def test_empty_and_oversized_texts_are_refused_with_the_reason(client):
    empty, huge = _request(text=""), _request(text="x" * 8001)
    for body in (empty, huge):
        await _publish(client, body)
    for body in (empty, huge):
        reply = await client.reply(body["request_id"], timeout=REFUSAL_WAIT_S)
        assert reply.outcome is Outcome.INVALID_REQUEST and "text" in reply.reason


async def test_a_request_id_reused_with_other_text_is_refused_and_the_same_request_again_gets_no_second_reply(client):
    body = _request()
    await _publish(client, body)
    original = await client.reply(body["request_id"])
    assert original.outcome is Outcome.END_TURN

    await _publish(client, {**body, "text": "cancel everything"})
    refused = await client.wait_for(lambda: client.replies[body["request_id"]][1:], timeout=REFUSAL_WAIT_S)
    assert refused[0].outcome is Outcome.INVALID_REQUEST and "used before" in refused[0].reason

    await _publish(client, body)  # the first request again: its reply stands, no second turn, no second reply
    marker = {**body, "request_id": f"{body['request_id']}_next"}
    await _publish(client, marker)  # after it in the same conversation (key-ordered): its reply means the copy was read
    await client.reply(marker["request_id"])
    await client.settled()  # every record handled: a second turn or reply for the copy would be in `seen`
    assert [r.outcome for r in client.replies[body["request_id"]]] == [Outcome.END_TURN, Outcome.INVALID_REQUEST]
    assert len({it["turn"]["turn_id"] for it in client.of_turn(topics.ITERATIONS, body["request_id"])}) == 1


async def test_a_record_without_its_conversation_as_key_is_refused_with_a_reply(client):
    unkeyed, mis_keyed = _request(), _request()
    await _publish(client, unkeyed, keyed=False)
    await _publish(client, mis_keyed, key=b"some-other-key")

    for body, shown in ((unkeyed, "no key"), (mis_keyed, "some-other-key")):
        reply = await client.reply(body["request_id"], timeout=REFUSAL_WAIT_S)
        assert reply.outcome is Outcome.INVALID_REQUEST
        assert shown in reply.reason and "conversation id" in reply.reason
        letters = await client.wait_for(lambda b=body: _letters_of(client, b["request_id"]), timeout=REFUSAL_WAIT_S)
        assert "conversation id" in letters[0]["reason"]
    assert not client.of_turn(topics.ITERATIONS, unkeyed["request_id"]) and not client.of_turn(
        topics.ITERATIONS, mis_keyed["request_id"]
    )
