"""The simulator's rate limits over HTTP, seen by the real anthropic SDK (max_retries=0): the API's 429, its headers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime

import anthropic
import httpx
import pytest

from roundtrip._kernel.clock import SYSTEM
from roundtrip._simulator import running_simulator
from roundtrip._simulator.overload import Overload
from roundtrip._simulator.ratelimits import RateLimits
from tests.ports import free_port_run

MODEL = "claude-sonnet-4-6"
HI = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
LIMIT_HEADERS = [
    f"anthropic-ratelimit-{kind}-{part}"
    for kind in ("requests", "input-tokens", "output-tokens", "tokens")
    for part in ("limit", "remaining", "reset")
]


def client(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="sim", max_retries=0)


async def test_429_is_the_sdks_rate_limit_error_with_retry_after_and_every_response_has_the_headers():
    with running_simulator(limits=RateLimits(SYSTEM, rpm=1, itpm=100_000, otpm=10_000)) as url:  # one request a minute
        raw = await client(url).messages.with_raw_response.create(**HI)
        message = await raw.parse()
        assert message.stop_reason == "end_turn"
        for header in LIMIT_HEADERS:
            assert header in raw.headers, header
        assert raw.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert raw.headers["anthropic-ratelimit-output-tokens-remaining"] == str(10_000 - message.usage.output_tokens)
        datetime.fromisoformat(raw.headers["anthropic-ratelimit-requests-reset"])  # RFC 3339
        with pytest.raises(anthropic.RateLimitError) as caught:
            await client(url).messages.create(**HI)
        error = caught.value
        assert error.status_code == 429
        assert (
            error.body["error"]["type"] == "rate_limit_error"
            and "1 requests per minute" in error.body["error"]["message"]
        )
        assert 1 <= int(error.response.headers["retry-after"]) <= 60
        for header in LIMIT_HEADERS:
            assert header in error.response.headers, header
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/health")).json()["rate_limited"] == 1


async def test_the_limit_is_halved_mid_run_through_the_control_endpoint():
    with running_simulator(limits=RateLimits(SYSTEM, rpm=600)) as url:
        raw = await client(url).messages.with_raw_response.create(**HI)
        assert raw.headers["anthropic-ratelimit-requests-limit"] == "600"
        async with httpx.AsyncClient(base_url=url) as http:
            answer = await http.post("/v1/_limits", json={"rpm": 300})
            assert answer.status_code == 200 and answer.json()["limits"] == {"rpm": 300}
            refused = await http.post("/v1/_limits", json={"rpm": 0})
            assert (
                refused.status_code == 400
                and "rpm: expected a positive whole number" in refused.json()["error"]["message"]
            )
        raw = await client(url).messages.with_raw_response.create(**HI)
        assert raw.headers["anthropic-ratelimit-requests-limit"] == "300"


async def test_an_overload_burst_answers_529_overloaded_to_everyone_until_it_ends():
    with running_simulator(overload=Overload(SYSTEM)) as url:
        await client(url).messages.create(**HI)
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.post("/v1/_overload", json={"seconds": 600})).status_code == 200
            with pytest.raises(anthropic.OverloadedError) as caught:
                await client(url).messages.create(**HI)
            assert caught.value.body["error"]["type"] == "overloaded_error"
            assert (await http.get("/health")).json()["overloaded"] == 1
            await http.post("/v1/_overload", json={"seconds": 0})  # ends it
            await client(url).messages.create(**HI)
            await http.post("/v1/_overload", json={"seconds": 600, "status": 500})  # an outage rather than an overload
            with pytest.raises(anthropic.InternalServerError):
                await client(url).messages.create(**HI)
            assert (await http.post("/v1/_overload", json={"seconds": 1, "status": 404})).status_code == 400


def test_the_simulator_process_reads_its_limits_from_the_environment(tmp_path):
    port = free_port_run(1)
    env = {
        **os.environ,
        "ROUNDTRIP_SIMULATOR_PORT": str(port),
        "ROUNDTRIP_SIMULATOR_RPM": "1",
        "ROUNDTRIP_SIMULATOR_ITPM": "5000",
        "ROUNDTRIP_STATE_DIR": str(tmp_path),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "roundtrip._simulator"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                assert process.poll() is None and time.monotonic() < deadline, process.stderr.read().decode()
                time.sleep(0.1)  # poll interval: the simulator answering
        sync = anthropic.Anthropic(base_url=url, api_key="sim", max_retries=0)
        raw = sync.messages.with_raw_response.create(**HI)
        assert raw.headers["anthropic-ratelimit-requests-limit"] == "1"
        assert raw.headers["anthropic-ratelimit-input-tokens-limit"] == "5000"
        with pytest.raises(anthropic.RateLimitError):
            sync.messages.create(**HI)
    finally:
        process.terminate()
        process.wait(timeout=10)
