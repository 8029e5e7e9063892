"""A streamed model call, with the real anthropic SDK against the simulator over HTTP: its text published in chunks
as it comes (in order, batched, the stream's last chunk final), the iteration event the one a plain call makes (usage
from the stream's final message), and a stream the API breaks off mid-answer cut and tried again."""

from __future__ import annotations

import asyncio

import pytest

from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.events import CallModel, StreamedText, Turn
from roundtrip._model.client import ModelClient
from roundtrip._model.streamed import Chunks
from roundtrip._simulator.server import running_simulator
from tests.agents import shop_model_client
from tests.cores import model_core, respond

TURN = Turn(
    turn_id="turn_s",
    request_id="req_s",
    conversation_id="conv_s",
    customer_id="cus_1001",
    persona="parallel",  # its first answer: some text, then two tool calls
    stream=True,
)
ASK = [{"role": "user", "content": "cancel my last order"}]
LONG = "Tell me everything about my orders, my refunds, shipping and the help center " * 8


@pytest.fixture(scope="module")
def simulator():
    with running_simulator() as url:
        yield url


def client_for(url: str, headers: dict[str, str] | None = None) -> ModelClient:
    settings = Settings(_env_file=None, anthropic_api_key=None, anthropic_base_url=url, model_max_retries=1)
    client = shop_model_client(settings)
    if headers:
        client._client = client._client.with_options(default_headers=headers)  # the simulator's fault controls
    return client


class Sent:
    def __init__(self) -> None:
        self.chunks: list[StreamedText] = []

    async def __call__(self, chunk: StreamedText, conversation_id: str) -> None:
        assert conversation_id == TURN.conversation_id  # keyed by the conversation
        self.chunks.append(chunk)


def _text(event) -> str:
    return "".join(b["text"] for b in event.content if b["type"] == "text")


async def test_a_streamed_call_publishes_its_text_in_order_and_makes_the_plain_calls_event(simulator):
    client, sent = client_for(simulator), Sent()
    plain = await respond(CallModel(turn=TURN, step=0, messages=ASK), client)  # writes the prompt cache
    command = CallModel(turn=TURN, step=0, messages=ASK)
    chunks = Chunks(TURN, 1, sent, chunk_s=10.0, chunk_chars=1)
    streamed = await respond(command, client, chunks=chunks)
    await chunks.sent()  # the model service awaits them beside the iteration event
    again = await respond(CallModel(turn=TURN, step=0, messages=ASK), client)  # reads it, as the stream did
    await client.aclose()
    assert (streamed.content, streamed.stop_reason, streamed.tool_calls) == (
        plain.content,
        plain.stop_reason,
        plain.tool_calls,
    )
    assert streamed.usage == again.usage and streamed.spent == again.spent and streamed.usage.output_tokens > 1
    chunks = sent.chunks
    assert [c.sequence for c in chunks] == list(range(len(chunks))) and len({c.stream_id for c in chunks}) == 1
    assert "".join(c.text for c in chunks) == _text(streamed) != ""
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].tool_use is (streamed.stop_reason == "tool_use") and not any(c.cut for c in chunks)
    assert {(c.turn_id, c.step, c.request_id) for c in chunks} == {("turn_s", 1, "req_s")}


async def test_chunks_are_batched_by_size_and_by_time():
    words = [f"word{i} " for i in range(60)]
    by_size, by_time = Sent(), Sent()
    sized, timed = Chunks(TURN, 1, by_size, chunk_s=10.0, chunk_chars=40), Chunks(TURN, 1, by_time, 0.05, 10_000)
    sized.begin(), timed.begin()
    for n, word in enumerate(words):
        sized.text(word)
        timed.text(word)
        if n % 20 == 19:
            await asyncio.sleep(0.06)  # a pause longer than chunk_s: the next piece goes out at once
    sized.end("end_turn"), timed.end("end_turn")
    await sized.sent(), await timed.sent()
    assert "".join(c.text for c in by_size.chunks) == "".join(words) == "".join(c.text for c in by_time.chunks)
    assert all(40 <= len(c.text) < 40 + 8 for c in by_size.chunks[:-1]) and by_size.chunks[-1].final
    assert 2 <= len(by_time.chunks) <= 4 < len(by_size.chunks)  # a chunk per pause, not per word


async def test_a_stream_the_api_breaks_off_is_cut_and_the_retry_streams_again(simulator):
    """An overloaded_error mid-stream is a 529: the limiter hears it, the call is tried again as a new stream, the
    broken one is cut; the event is the retry's, billed once."""
    faults = {
        "x-roundtrip-fault": "529-midstream",
        "x-roundtrip-fault-attempts": "1",
        "x-roundtrip-retry-after-ms": "1",
    }
    client, sent = client_for(simulator, faults), Sent()
    turn = TURN.model_copy(update={"persona": "terse"})
    event = await respond(
        CallModel(turn=turn, step=0, messages=[{"role": "user", "content": LONG}]),
        client,
        chunks=(chunks := Chunks(turn, 1, sent, 0.0, 1)),
    )
    await chunks.sent()
    await client.aclose()
    first, second = sent.chunks[0].stream_id, sent.chunks[-1].stream_id
    broken = [c for c in sent.chunks if c.stream_id == first]
    kept = [c for c in sent.chunks if c.stream_id == second]
    assert first != second and event.error is None
    assert broken[-1].cut and broken[-1].text == "" and not any(c.final for c in broken) and broken[0].text
    assert [c.sequence for c in broken] == list(range(len(broken))) and [c.sequence for c in kept] == list(
        range(len(kept))
    )
    assert "".join(c.text for c in kept) == _text(event) and kept[-1].final and not any(c.cut for c in kept)
    assert sent.chunks.index(broken[-1]) < sent.chunks.index(kept[0])  # the cut comes before the retry's text


async def test_a_call_that_fails_after_some_text_ends_its_stream_cut(simulator):
    faults = {"x-roundtrip-fault": "529-midstream", "x-roundtrip-retry-after-ms": "1"}
    client, sent = client_for(simulator, faults), Sent()
    turn = TURN.model_copy(update={"persona": "terse", "deadline_at": 0.0})
    command = CallModel(turn=turn, step=0, messages=[{"role": "user", "content": LONG}])
    chunks = Chunks(turn, 1, sent, 0.0, 1)
    # wait_for_capacity off: a capacity refusal is the call's error at once
    event = await respond(command, client, chunks=chunks, wait_for_capacity=False)
    await chunks.sent()
    await client.aclose()
    assert event.error and "overloaded" in event.error
    assert sent.chunks[0].text and sent.chunks[-1].cut and not any(c.final for c in sent.chunks)


def test_a_turn_streams_by_its_request_else_by_the_setting():
    sent = Sent()
    on = model_core(None, settings=Settings(_env_file=None, stream_replies=True))
    off = model_core(None, settings=Settings(_env_file=None))
    plain, asked = TURN.model_copy(update={"stream": None}), TURN
    refused = TURN.model_copy(update={"stream": False})
    assert off.chunks_for(CallModel(turn=plain, step=0, messages=ASK), sent, None) is None
    assert on.chunks_for(CallModel(turn=refused, step=0, messages=ASK), sent, None) is None
    assert on.chunks_for(CallModel(turn=plain, step=2, messages=ASK), sent, None).step == 3
    assert off.chunks_for(CallModel(turn=asked, step=0, messages=ASK), sent, None) is not None


async def test_a_call_published_before_the_process_started_first_cuts_every_earlier_stream_of_its_step():
    """Its process may have died mid-stream (the e2e kills one): the new one cannot know that stream's id."""
    sent = Sent()
    on = model_core(None, settings=Settings(_env_file=None, stream_replies=True), started_at=100.0)
    command = CallModel(turn=TURN, step=1, messages=ASK)
    for published_at, cuts in ((99.0, 1), (101.0, 0)):  # the process started at 100
        sent.chunks.clear()
        chunks = on.chunks_for(command, sent, published_at)
        await chunks.sent()
        assert sent.chunks == []  # nothing before the claim: the event's customer is not checked yet
        chunks.begin()  # the claim succeeded
        await chunks.sent()
        assert [(c.step, c.stream_id, c.cut) for c in sent.chunks] == [(2, "", True)] * cuts


class Refusing:
    async def claim_model_call(self, turn, step, now):
        return False


async def test_a_redelivered_call_whose_claim_is_refused_publishes_nothing_on_the_stream():
    """A copy of another customer's call with an old record timestamp: no cut reaches that conversation's stream."""
    sent = Sent()
    on = model_core(None, Refusing(), Settings(_env_file=None, stream_replies=True), started_at=100.0)
    command = CallModel(turn=TURN, step=1, messages=ASK)
    chunks = on.chunks_for(command, sent, 99.0)
    assert await on.respond(command, chunks) is None
    await chunks.sent()
    assert sent.chunks == []
