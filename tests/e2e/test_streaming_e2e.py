"""Streamed replies and progress through the real fleet, read with a plain Kafka client (issue 34).

A request with "stream": true gets its text on support.stream in chunks, in order, then exactly one reply on
support.replies whose text is the final step's chunks put together; every step is told on support.status as it
starts. A model service SIGKILLed mid-stream leaves its stream cut (the call redelivered to the new process cuts the
step's earlier streams) and the turn still gets exactly one reply.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict

import pytest

from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome

LATENCY_MS = 2500  # the killed stream's text comes over about 1.75 s, after 0.75 s to its first event


async def _ask_streamed(client, text: str, persona: str, customer: str = "cus_1001") -> str:
    request_id = f"req_{uuid.uuid4().hex[:10]}"
    body = {
        "request_id": request_id,
        "conversation_id": f"conv_{request_id}",
        "customer_id": customer,
        "text": text,
        "persona": persona,
        "stream": True,
    }
    await client.publish_raw(json.dumps(body).encode(), key=body["conversation_id"].encode())
    return request_id


def _chunks(client, request_id: str) -> list[dict]:
    return [c for c in client.seen[topics.SUPPORT_STREAM] if c["request_id"] == request_id]


def _streams(chunks: list[dict]) -> dict[tuple[int, str], list[dict]]:
    """(step, stream id) -> its chunks in the order they arrived (cuts of a whole step or turn left out)."""
    streams: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for chunk in chunks:
        if chunk["stream_id"]:
            streams[(chunk["step"], chunk["stream_id"])].append(chunk)
    return streams


def _working(client, request_id: str) -> list[int]:
    return [
        s["step"]
        for s in client.seen[topics.SUPPORT_STATUS]
        if s["request_id"] == request_id and s["state"] == "working"
    ]


async def test_a_streamed_turn_gets_its_chunks_in_order_then_one_reply_that_is_its_final_text(client):
    request_id = await _ask_streamed(client, "where are my orders?", "parallel")
    reply = await client.reply(request_id, timeout=60)
    await client.settled()  # every record handled: a second reply, or a late chunk, would be in `seen` now
    assert len(client.replies[request_id]) == 1 and reply.outcome is Outcome.END_TURN and reply.steps >= 2
    streams = _streams(_chunks(client, request_id))
    assert sorted({step for step, _ in streams}) == list(range(1, reply.steps + 1))  # one stream a step
    assert len(streams) == reply.steps and not any(c["cut"] for c in _chunks(client, request_id))
    for (step, _), chunks in streams.items():
        assert [c["sequence"] for c in chunks] == list(range(len(chunks)))  # in order, none twice
        assert [c["final"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
        assert chunks[-1]["tool_use"] is (step < reply.steps)  # the steps before the last went on to tools
    (last,) = [chunks for (step, _), chunks in streams.items() if step == reply.steps]
    assert "".join(c["text"] for c in last) == reply.text
    assert sorted(set(_working(client, request_id))) == list(range(1, reply.steps + 1))  # every step told


@pytest.mark.kills_services
async def test_a_model_service_killed_mid_stream_leaves_the_stream_cut_and_the_turn_one_reply(client, fleet):
    async with fleet.reconfigured(("simulator",), simulator_latency_ms=LATENCY_MS):
        request_id = await _ask_streamed(client, "hello, anybody there?", "terse")
        await client.wait_for(lambda: [c for c in _chunks(client, request_id) if c["text"]], timeout=30)
        await fleet.kill("model")  # SIGKILL, mid-stream: its call is neither answered nor committed
        try:
            killed = {c["stream_id"] for c in _chunks(client, request_id)}
            await client.read_to_end()  # a final chunk the dead process had sent would be in `seen` now
            assert not any(c["final"] for c in _chunks(client, request_id))  # the stream never ended
        finally:
            await fleet.respawn("model")
        # the call redelivered to the new process, once its group has given up the dead member (its session timeout)
        reply = await client.reply(request_id, timeout=60)
        await client.settled()  # the model's group committed past the call: no third delivery of it can come
    assert len(client.replies[request_id]) == 1 and reply.outcome is Outcome.END_TURN and reply.steps == 1
    chunks = _chunks(client, request_id)
    (whole_step_cut,) = [c for c in chunks if c["cut"] and c["stream_id"] == "" and c["step"] == 1]
    after = chunks[chunks.index(whole_step_cut) + 1 :]
    assert not {c["stream_id"] for c in after} & killed  # the cut came after everything the dead process sent
    (kept,) = [s for key, s in _streams(after).items() if key[0] == 1]
    assert [c["sequence"] for c in kept] == list(range(len(kept))) and kept[-1]["final"]
    assert "".join(c["text"] for c in kept) == reply.text
    assert 1 in _working(client, request_id)
