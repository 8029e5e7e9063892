"""An operator's view under load: executor lag builds up while the executors are down and drains when
they are back (`roundtrip lag --json`), every request still gets exactly one reply, and the services'
/metrics, /healthz and /readyz say what happened."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from roundtrip._kernel.kafka.admin import consumer_lag
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome
from tests.ports import free_port_run

REQUESTS = 40
SIMULATOR_LATENCY_MS = 300
ASK_EVERY_S = 0.1  # requests arrive over ~4 s, as customers do: the backlog grows while it is watched

OPENMETRICS = "application/openmetrics-text; version=1.0.0"  # the exposition that carries exemplars


async def _scrape(http: httpx.AsyncClient, port: int) -> dict[tuple[str, tuple], float]:
    text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


DEFAULT_END = {"outcome": "end_turn", "agent_version": "default"}  # turns of the default version that ended well


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def _executor_lag(settings) -> int:
    (group,) = await consumer_lag(settings.bootstrap_servers, settings.topic_prefix, "executor")
    return sum(p.lag for p in group.partitions if p.topic == settings.topic_prefix + topics.TOOL_BATCHES)


async def _lag_cli(env: dict[str, str]) -> dict:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "roundtrip._cli.main",
        "lag",
        "--json",
        "--group",
        "executor",
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    return json.loads(out)


async def _until(predicate, timeout: float, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := await predicate():
            return result
        await asyncio.sleep(every)  # poll interval: the caller's `every`
    raise AssertionError(f"not within {timeout:g} s")


@pytest.mark.kills_services
async def test_executor_backlog_builds_up_in_lag_then_drains_and_every_request_gets_one_reply(
    client, fleet, fleet_settings
):
    settings, env = fleet_settings
    batches = settings.topic_prefix + topics.TOOL_BATCHES
    base = free_port_run(11)  # gateway: base, guard: base + 2, executors: base + 4 and base + 10 (replicas step by 6)
    async with (
        fleet.reconfigured(("simulator",), simulator_latency_ms=SIMULATOR_LATENCY_MS),
        fleet.reconfigured(("gateway", "guard"), health_port=base, health_port_per_service=True),
        httpx.AsyncClient(timeout=5) as http,
    ):
        guard_port = base + 2

        async def ready():
            return all(
                [(await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200 for port in (base, guard_port)]
            )

        await _until(ready, 20)
        assert (await http.get(f"http://127.0.0.1:{guard_port}/healthz")).json()["status"] == "ok"
        before, replies_before = await _scrape(http, guard_port), await _scrape(http, base)
        lag_before = await _executor_lag(settings)

        await fleet.kill("executor")
        seen = [lag_before]

        async def all_queued():
            seen.append(await _executor_lag(settings))
            return seen[-1] >= lag_before + REQUESTS

        # The backlog on turn.tool_batches builds up as the requests' first steps reach it, watched meanwhile.
        watching = asyncio.create_task(_until(all_queued, 30, every=0.2))
        ids = []
        for i in range(REQUESTS):
            ids.append(await client.ask("show me my orders", customer=f"cus_100{1 + i % 3}", persona="careful"))
            await asyncio.sleep(ASK_EVERY_S)  # pacing: the requests spread over the executors' absence
        await watching
        assert seen == sorted(seen), f"the backlog only grows while no executor runs: {seen}"
        assert len(set(seen)) >= 3, f"the backlog should be seen building up, not appear at once: {seen}"

        document = await _lag_cli(env)
        (group,) = document["groups"]
        assert group["group"] == settings.topic_prefix + "roundtrip-executor"  # the prefix names the groups too
        rows = [p for p in group["partitions"] if p["topic"] == batches]
        assert len(rows) == (settings.executor_partitions or settings.partitions)
        assert sum(p["lag"] for p in rows) >= lag_before + REQUESTS
        assert all(p["lag"] == p["end"] - (p["committed"] if p["committed"] is not None else p["start"]) for p in rows)
        assert not any(r for ids_ in ids for r in client.replies.get(ids_, [])), (
            "no reply can come while executors are down"
        )

        await fleet.respawn("executor")

        async def drained():
            return await _executor_lag(settings) == 0

        await client.wait_for(lambda: all(client.replies.get(i) for i in ids), timeout=45)
        await _until(drained, 20)
        after_cli = await _lag_cli(env)
        assert sum(p["lag"] for p in after_cli["groups"][0]["partitions"] if p["topic"] == batches) == 0
        assert after_cli["groups"][0]["members"], "the respawned executors are members again"

        await client.settled()  # every record handled: a duplicate reply would be in `seen`
        assert all(len(client.replies[i]) == 1 for i in ids), {
            i: len(client.replies[i]) for i in ids if len(client.replies[i]) != 1
        }
        assert {client.replies[i][0].outcome for i in ids} == {Outcome.END_TURN}

        # The guard's counters moved by exactly these turns; the executors (respawned with health ports) ran the calls.
        after = await _scrape(http, guard_port)
        assert (
            _value(after, "roundtrip_turns_total", **DEFAULT_END)
            - _value(before, "roundtrip_turns_total", **DEFAULT_END)
            == REQUESTS
        )
        assert _value(after, "roundtrip_turn_steps_count") - _value(before, "roundtrip_turn_steps_count") == REQUESTS
        assert (
            _value(after, "roundtrip_turn_steps_sum") - _value(before, "roundtrip_turn_steps_sum") == 2 * REQUESTS
        )  # list, then answer
        assert _value(after, "roundtrip_cost_usd_total", model=settings.model) > _value(
            before, "roundtrip_cost_usd_total", model=settings.model
        )
        assert _value(after, "process_resident_memory_bytes") > 0
        # the gateway timed each reply, a turn's trace id as the exemplar (the dashboard's link to Jaeger)
        replied = await _scrape(http, base)
        chat = {**DEFAULT_END, "lane": "interactive"}
        timed = _value(replied, "roundtrip_reply_seconds_count", **chat)
        assert timed - _value(replies_before, "roundtrip_reply_seconds_count", **chat) == REQUESTS
        openmetrics = await http.get(f"http://127.0.0.1:{base}/metrics", headers={"Accept": OPENMETRICS})
        exemplars = re.findall(
            r'^roundtrip_reply_seconds_bucket\{.*# \{trace_id="([0-9a-f]{32})"\}', openmetrics.text, re.M
        )
        assert exemplars and set(exemplars) <= {client.replies[i][0].trace_id for i in ids}
        executors = [await _scrape(http, port) for port in (base + 4, base + 10)]
        ran = sum(_value(s, "roundtrip_tool_executions_total", tool="list_orders", result="ok") for s in executors)
        assert ran == REQUESTS
        received = sum(
            _value(
                s, "faststream_received_messages_total", app_name="roundtrip-executor", broker="kafka", handler=batches
            )
            for s in executors
        )
        assert received >= REQUESTS
        for port in (base + 4, base + 10):
            assert (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
            assert (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
