"""The fleet on each cloud platform (ROUNDTRIP_MODEL_PROVIDER), as processes, against the simulator in that platform's
shape, reached by the SDK's own client of the platform: AsyncAnthropicBedrock (SigV4 from fake AWS keys in the
environment, the stream in AWS's event-stream framing), AsyncAnthropicVertex (a bearer token) and AsyncAnthropicFoundry
(its key header).

For each: a turn of three steps whose second makes two parallel tool calls, answered together; cache reads from the
second call on; a streamed turn whose final step's chunks make up its reply; and a model id of another platform's form
refused at start in one line. The model service of the session's fleet is restarted on the platform for the test, then
on the Anthropic API again.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from contextlib import asynccontextmanager

import httpx
import pytest

from roundtrip._fleet.children import run_argv
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome

AWS_KEYS = {  # fake: botocore signs with them, the simulator checks that a SigV4 signature is there
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    "AWS_EC2_METADATA_DISABLED": "true",
}
PLATFORMS = {
    "bedrock": (
        "",
        {"ROUNDTRIP_MODEL": "us.anthropic.claude-sonnet-4-6", "ROUNDTRIP_MODEL_REGION": "us-east-1", **AWS_KEYS},
        "claude-sonnet-4-6",  # the Anthropic API's id: not Bedrock's
    ),
    "vertex": (
        "/v1",
        {
            "ROUNDTRIP_MODEL": "claude-sonnet-4-6",
            "ROUNDTRIP_MODEL_REGION": "us-east5",
            "ROUNDTRIP_VERTEX_PROJECT_ID": "shop-prod",
            "ROUNDTRIP_VERTEX_ACCESS_TOKEN": "ya29.e2e-fake-token",
        },
        "anthropic.claude-sonnet-4-6",  # Bedrock's id: not Vertex AI's
    ),
    "foundry": (
        "/anthropic",
        {"ROUNDTRIP_MODEL": "claude-sonnet-4-6", "ROUNDTRIP_FOUNDRY_API_KEY": "foundry-e2e-fake-key"},
        "us.anthropic.claude-sonnet-4-6",  # a Bedrock inference profile: not a Foundry deployment
    ),
}


OTEL_NAMES = {"bedrock": "aws.bedrock", "vertex": "gcp.vertex_ai", "foundry": "azure.ai.inference"}


def platform_env(settings, name: str) -> dict[str, str]:
    suffix, values, _ = PLATFORMS[name]
    return {
        "ROUNDTRIP_MODEL_PROVIDER": name,
        "ROUNDTRIP_ANTHROPIC_BASE_URL": f"http://127.0.0.1:{settings.simulator_port}{suffix}",
        **values,
    }


@asynccontextmanager
async def model_on(fleet, env: dict[str, str]):
    """The fleet's model service restarted with `env` (a platform's settings and credentials); afterwards without."""
    await fleet.restart("model", env)
    try:
        yield
    finally:
        for key in env:
            fleet.sync.env.pop(key, None)
        await asyncio.to_thread(fleet.sync.respawn_exited)
        await fleet.restart("model")


async def _platform_calls(settings, name: str) -> int:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.simulator_port}", timeout=10) as simulator:
        return (await simulator.get("/health")).json()["platforms"].get(name, 0)


async def _ask(client, text: str, persona: str, stream: bool = False) -> str:
    request_id = f"req_{uuid.uuid4().hex[:10]}"
    body = {
        "request_id": request_id,
        "conversation_id": f"conv_{request_id}",
        "customer_id": "cus_1001",
        "text": text,
        "persona": persona,
        "stream": stream,
    }
    await client.publish_raw(json.dumps(body).encode(), key=body["conversation_id"].encode())
    return request_id


async def _chat_spans(settings, trace_id: str, steps: int) -> list[dict]:
    """The SDK's spans of the model calls of a turn's trace, from the span file (each service writes it in batches)."""
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        lines = settings.effective_span_file.read_text().splitlines()
        spans = [json.loads(line) for line in lines if line.strip()]
        chats = [
            s for s in spans if s["trace_id"] == trace_id and s["attributes"].get("gen_ai.operation.name") == "chat"
        ]
        if len(chats) >= steps or asyncio.get_running_loop().time() > deadline:
            return chats
        await asyncio.sleep(0.5)  # poll interval: the chat requests the provider's stub recorded


def _refused_at_start(fleet, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        run_argv("model"),
        env={**os.environ, **fleet.sync.env, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("name", ["bedrock", "vertex", "foundry"])
async def test_the_fleet_runs_its_turns_on_each_platform_with_the_platforms_sdk_client(client, fleet, name):
    settings = fleet.sync.settings
    env = platform_env(settings, name)
    before = await _platform_calls(settings, name)
    async with model_on(fleet, env):
        request_id = await _ask(client, "where are my orders?", "parallel")
        streamed_id = await _ask(client, "where are my orders?", "parallel", stream=True)
        reply = await client.reply(request_id, timeout=90)
        streamed = await client.reply(streamed_id, timeout=90)
        # the SDK's span of each call (one a step) names the platform as the GenAI conventions do (read before the
        # service is restarted: its last batch of spans goes out on its own schedule)
        chats = await _chat_spans(settings, reply.trace_id, reply.steps)

    # three steps: the orders listed, two lookups in parallel, the answer
    assert reply.outcome is Outcome.END_TURN and reply.steps >= 3, reply
    iterations = sorted(client.of_turn(topics.ITERATIONS, request_id), key=lambda it: it["step"])
    wide = [it for it in iterations if len(it["tool_calls"]) >= 2]
    assert wide, "the parallel persona's two tool calls in one response"
    ids = [call["id"] for call in wide[0]["tool_calls"]]
    next_call = next(c for c in client.of_turn(topics.MODEL_CALLS, request_id) if c["step"] == wide[0]["step"])
    results = next_call["messages"][-1]["content"]
    assert [b["tool_use_id"] for b in results] == ids and not any(b.get("is_error") for b in results)
    # the static prefix (tools, system prompt) written by the first call, read from the cache from the second on
    assert all(it["usage"]["cache_read_input_tokens"] > 0 for it in iterations[1:]), [it["usage"] for it in iterations]
    assert reply.usage.cache_read_input_tokens > 0

    # the streamed turn: its last step's chunks, in order, are its reply
    assert streamed.outcome is Outcome.END_TURN
    chunks = [c for c in client.seen[topics.SUPPORT_STREAM] if c["request_id"] == streamed_id and c["stream_id"]]
    last = [c for c in chunks if c["step"] == streamed.steps]
    assert [c["sequence"] for c in last] == list(range(len(last))) and last[-1]["final"]
    assert "".join(c["text"] for c in last) == streamed.text and streamed.text

    # every call of both turns went to the platform's endpoints
    assert await _platform_calls(settings, name) - before >= reply.steps + streamed.steps
    assert len(chats) == reply.steps and {span["attributes"]["gen_ai.provider.name"] for span in chats} == {
        OTEL_NAMES[name]
    }, chats

    wrong = _refused_at_start(fleet, {**env, "ROUNDTRIP_MODEL": PLATFORMS[name][2]})
    assert wrong.returncode == 1, wrong.stderr
    (line,) = wrong.stderr.strip().splitlines()
    assert line.startswith("error: model refuses to start: ROUNDTRIP_MODEL=") and "Traceback" not in wrong.stderr
    assert not any(secret in wrong.stderr for secret in ("EXAMPLEKEY", "ya29.", "foundry-e2e-fake-key"))
