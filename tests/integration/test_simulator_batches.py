"""The simulator's Message Batches API over HTTP, driven by the real anthropic SDK's `messages.batches` client: what the
model service's batch lane and CI rely on when no key is set."""

from __future__ import annotations

import asyncio

import anthropic
import httpx
import pytest

from roundtrip._simulator import running_simulator

MODEL = "claude-sonnet-4-6"
TOOLS = [{"name": "list_orders", "description": "The customer's orders", "input_schema": {"type": "object"}}]


def params(text: str, **extra) -> dict:
    return {"model": MODEL, "max_tokens": 200, "messages": [{"role": "user", "content": text}], **extra}


def client(url: str, **headers: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="sim", max_retries=0, default_headers=headers)


async def ended(sdk: anthropic.AsyncAnthropic, batch_id: str) -> anthropic.types.messages.MessageBatch:
    for _ in range(100):
        batch = await sdk.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        await asyncio.sleep(0.05)  # a poll interval of the batch's status, 100 of them at most
    raise AssertionError(f"batch {batch_id} still {batch.processing_status} after 5 s")


async def test_a_batch_is_in_progress_then_ends_with_one_result_per_custom_id_as_plain_calls_answer():
    with running_simulator(batch_delay_ms=300) as url:
        sdk = client(url, **{"x-roundtrip-persona": "careful"})
        created = await sdk.messages.batches.create(
            requests=[
                {"custom_id": "turn-1_step-1", "params": params("Please cancel my order", tools=TOOLS)},
                {"custom_id": "turn-2_step-1", "params": params("What are your opening hours?")},
            ]
        )
        assert created.id.startswith("msgbatch_") and created.processing_status == "in_progress"
        assert created.request_counts.processing == 2 and created.results_url is None
        with pytest.raises(anthropic.AnthropicError, match="results_url"):
            await sdk.messages.batches.results(created.id)  # the SDK's own refusal: not ended yet

        batch = await ended(sdk, created.id)
        assert batch.request_counts.succeeded == 2 and batch.request_counts.processing == 0
        assert batch.ended_at is not None and batch.results_url.endswith(f"/v1/messages/batches/{batch.id}/results")
        results = {r.custom_id: r.result async for r in await sdk.messages.batches.results(batch.id)}
        assert set(results) == {"turn-1_step-1", "turn-2_step-1"}
        first = results["turn-1_step-1"]
        assert first.type == "succeeded" and first.message.stop_reason == "tool_use"
        assert [b.name for b in first.message.content if b.type == "tool_use"] == ["list_orders"]
        assert first.message.usage.input_tokens > 0  # billed like the plain call, the batch rate is the fleet's

        page = await sdk.messages.batches.list(limit=10)
        assert [b.id for b in page.data] == [batch.id]


async def test_errored_and_expired_results_on_demand_and_a_bad_params_object_errors_only_its_own_request():
    with running_simulator(batch_delay_ms=0) as url:
        sdk = client(url)
        created = await sdk.messages.batches.create(
            requests=[
                {"custom_id": "ok", "params": params("hello")},
                {"custom_id": "boom", "params": params("hello")},
                {"custom_id": "late", "params": params("hello")},
                {"custom_id": "bad", "params": {"model": MODEL, "messages": []}},  # validated at processing
            ],
            extra_headers={"x-roundtrip-batch-errored": "boom", "x-roundtrip-batch-expired": "late"},
        )
        batch = await ended(sdk, created.id)
        counts = batch.request_counts
        assert (counts.succeeded, counts.errored, counts.expired) == (1, 2, 1)
        results = {r.custom_id: r.result async for r in await sdk.messages.batches.results(batch.id)}
        assert results["ok"].type == "succeeded" and results["late"].type == "expired"
        assert results["boom"].type == "errored" and results["boom"].error.error.type == "api_error"
        assert results["bad"].type == "errored" and results["bad"].error.error.type == "invalid_request_error"


async def test_a_canceled_batch_ends_with_its_requests_canceled_and_can_then_be_deleted():
    with running_simulator(batch_delay_ms=60_000) as url:
        sdk = client(url)
        created = await sdk.messages.batches.create(requests=[{"custom_id": "a", "params": params("hi")}])
        with pytest.raises(anthropic.BadRequestError, match="in progress"):
            await sdk.messages.batches.delete(created.id)
        assert (await sdk.messages.batches.cancel(created.id)).processing_status == "canceling"
        batch = await ended(sdk, created.id)
        assert batch.request_counts.canceled == 1
        assert (await sdk.messages.batches.delete(batch.id)).type == "message_batch_deleted"
        with pytest.raises(anthropic.NotFoundError):
            await sdk.messages.batches.retrieve(batch.id)


async def test_a_malformed_batch_is_refused_whole_and_every_create_is_counted_per_custom_id():
    with running_simulator(batch_delay_ms=0) as url:
        sdk = client(url)
        with pytest.raises(anthropic.BadRequestError, match="more than once"):
            await sdk.messages.batches.create(
                requests=[{"custom_id": "x", "params": params("a")}, {"custom_id": "x", "params": params("b")}]
            )
        with pytest.raises(anthropic.BadRequestError, match="custom_id"):
            await sdk.messages.batches.create(requests=[{"custom_id": "has space", "params": params("a")}])
        for _ in range(2):
            await sdk.messages.batches.create(requests=[{"custom_id": "twice", "params": params("a")}])
        await sdk.messages.batches.create(requests=[{"custom_id": "once", "params": params("a")}])
        async with httpx.AsyncClient(base_url=url) as http:
            seen = (await http.get("/v1/_batches")).json()["submissions"]
            unsigned = await http.get("/v1/messages/batches")  # no x-api-key
        assert seen == {"twice": 2, "once": 1}  # a refused batch counts nothing
        assert unsigned.status_code == 401 and unsigned.json()["error"]["type"] == "authentication_error"
