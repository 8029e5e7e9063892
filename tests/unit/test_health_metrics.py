"""The health endpoint over real HTTP on loopback, and the metrics each decision moves (guard, gate, executor...)."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client import REGISTRY

from roundtrip._kernel.kafka import faststream_seam
from roundtrip._kernel.observability import health, metrics
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.events import CheckedCall, Outcome, StartTurn
from roundtrip._sdk.context import Dependencies, ToolError
from tests.agents import tool_runner
from tests.gate_calls import check_call
from tests.ports import free_port_run
from tests.unit.test_gate import call, gate, lookup, shop, turn  # noqa: F401 - fixtures
from tests.unit.test_guard_handlers import LIST, TURN, guard, iteration  # noqa: F401 - fixtures


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def server():
    checks = health.Health()
    s = health.HealthServer("executor", "127.0.0.1", [0], checks)
    await s.start()

    def register(kind, name, check):
        (checks.live if kind == "live" else checks.ready)(name, check)

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{s.port}") as http:
        yield SimpleNamespace(http=http, register=register, checks=checks)
    await s.stop()


# -- the endpoint ---------------------------------------------------------------------------------


async def test_probes_follow_the_registered_checks(server):
    state = {"alive": True, "ready": False}
    server.register("live", "t-consumer", lambda: state["alive"])

    async def ready() -> bool:
        return state["ready"]

    server.register("ready", "t-assigned", ready)

    live = await server.http.get("/healthz")
    assert live.status_code == 200 and live.json()["checks"]["t-consumer"] is True
    not_ready = await server.http.get("/readyz")
    assert not_ready.status_code == 503 and not_ready.json() == {
        "status": "failing",
        "service": "executor",
        "checks": {"t-assigned": False},
    }

    state.update(alive=False, ready=True)
    assert (await server.http.get("/healthz")).status_code == 503
    assert (await server.http.get("/readyz")).status_code == 200


async def test_a_check_that_raises_or_hangs_fails_the_probe_without_breaking_it(server, monkeypatch):
    monkeypatch.setattr(health, "CHECK_TIMEOUT_S", 0.2)

    def broken() -> bool:
        raise RuntimeError("no consumer")

    async def hangs() -> bool:
        await asyncio.sleep(10)  # a check that hangs past the probe's timeout
        return True

    server.register("live", "t-broken", broken)
    server.register("live", "t-hangs", hangs)
    response = await server.http.get("/healthz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["t-broken"].startswith("error: RuntimeError: no consumer") and checks["t-hangs"].startswith(
        "error: TimeoutError"
    )


async def test_a_heartbeat_fails_liveness_when_the_poll_loop_goes_quiet(server):
    beat = server.checks.heartbeat("t-poll", max_silence_s=0.2)
    assert (await server.http.get("/healthz")).status_code == 200
    await asyncio.sleep(0.3)  # past the heartbeat's 0.2 s of allowed silence
    assert (await server.http.get("/healthz")).status_code == 503
    beat()
    assert (await server.http.get("/healthz")).status_code == 200


async def test_metrics_are_the_prometheus_exposition_with_process_metrics(server):
    metrics.count_turn_end(Outcome.END_TURN, 3, "v2")
    response = await server.http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert 'roundtrip_turns_total{agent_version="v2",outcome="end_turn"}' in response.text
    assert "process_resident_memory_bytes" in response.text and "process_cpu_seconds_total" in response.text
    assert (await server.http.get("/nope")).status_code == 404
    assert (await server.http.post("/metrics")).status_code == 405


def test_the_port_is_off_by_default_exact_when_given_and_spread_per_service_on_one_host():
    assert health.port_candidates("guard", Settings()) == []
    assert health.port_candidates("guard", Settings(health_port=8080)) == [8080]
    spread = Settings(health_port=9400, health_port_per_service=True)
    services = ("gateway", "model", "guard", "gate", "executor", "console")
    assert [health.port_candidates(s, spread)[0] for s in services] == [9400, 9401, 9402, 9403, 9404, 9405]
    assert health.port_candidates("executor", spread)[:3] == [9404, 9410, 9416]  # a stride of the fleet's six


async def test_a_second_replica_on_the_host_takes_the_next_port_and_an_exact_port_in_use_is_a_clear_error():
    base = free_port_run(11)
    settings = Settings(health_port=base, health_port_per_service=True)
    first = health.HealthServer("executor", "127.0.0.1", health.port_candidates("executor", settings), health.Health())
    second = health.HealthServer("executor", "127.0.0.1", health.port_candidates("executor", settings), health.Health())
    await first.start()
    try:
        await second.start()
        assert (first.port, second.port) == (base + 4, base + 10)
        await second.stop()
        taken = health.HealthServer("guard", "127.0.0.1", [first.port], health.Health())
        with pytest.raises(RuntimeError, match="ROUNDTRIP_HEALTH_PORT"):
            await taken.start()
    finally:
        await first.stop()


def test_liveness_from_faststream_subscribers_fails_when_a_consume_task_died():
    done, running = SimpleNamespace(done=lambda: True), SimpleNamespace(done=lambda: False)
    concurrent = SimpleNamespace(running=True, consumer_subgroup=[object(), object()], tasks=[running, running])
    plain = SimpleNamespace(running=True, tasks=[running])
    app = SimpleNamespace(broker=SimpleNamespace(subscribers=[concurrent, plain]))
    state = {"started": True, "stopping": False}
    check = health.subscribers_alive(app, state, faststream_seam.consume_loops_alive)
    assert check()
    concurrent.tasks = [running, done]  # one of the two consumers' loops is gone
    assert not check()
    state["stopping"] = True  # a draining service is not killed by its probe
    assert check()
    state.update(started=False, stopping=False)  # nor a starting one
    assert check()


# -- the metrics, where each decision is taken ------------------------------------------------------


async def test_the_guard_counts_a_turn_once_with_its_steps_tokens_and_cost(guard):  # noqa: F811
    ended = sample("roundtrip_turns_total", outcome="end_turn", agent_version="default")
    steps = sample("roundtrip_turn_steps_count")
    tokens_in = sample("roundtrip_tokens_total", model="claude-sonnet-4-6", kind="input")
    cost = sample("roundtrip_cost_usd_total", model="claude-sonnet-4-6")
    step_latencies = sample("roundtrip_step_seconds_count")
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    await guard.loop.on_iteration(iteration(1, calls=[LIST]))
    await guard.loop.on_iteration(iteration(2, stop_reason="end_turn"))
    await guard.outbox.drain()
    assert await guard.loop.on_iteration(iteration(2, stop_reason="end_turn")) == "duplicate"  # counts nothing

    assert sample("roundtrip_turns_total", outcome="end_turn", agent_version="default") == ended + 1
    assert sample("roundtrip_turn_steps_count") == steps + 1
    assert sample("roundtrip_tokens_total", model="claude-sonnet-4-6", kind="input") == tokens_in + 200
    assert sample("roundtrip_cost_usd_total", model="claude-sonnet-4-6") == pytest.approx(
        cost + 2 * (100 * 3 + 10 * 15) / 1e6
    )
    assert sample("roundtrip_step_seconds_count") == step_latencies + 2


async def test_a_turn_the_guard_stops_is_a_drop_by_reason(guard):  # noqa: F811
    drops = sample("roundtrip_guard_drops_total", reason="step_limit")
    guard.loop.decisions.policy = dataclasses.replace(guard.loop.decisions.policy, max_steps=1)
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    assert await guard.loop.on_iteration(iteration(1, calls=[LIST])) == "step_limit"
    assert sample("roundtrip_guard_drops_total", reason="step_limit") == drops + 1
    assert sample("roundtrip_turns_total", outcome="step_limit", agent_version="default") >= 1


async def test_gate_rejections_are_counted_by_tool_and_reason_and_made_up_tools_share_one_label(gate):  # noqa: F811
    invented = sample("roundtrip_gate_rejections_total", tool="cancel_order", reason="not_allowed")
    unknown = sample("roundtrip_gate_rejections_total", tool="unknown", reason="unknown_tool")
    invalid = sample("roundtrip_gate_rejections_total", tool="list_orders", reason="invalid_input")
    await check_call(
        gate, call("cancel_order", {"order_id": "ord_9f3c4e21", "reason": "customer_request"}), "cus_1001", "turn_1"
    )
    await check_call(gate, call("drop_database_now", {}), "cus_1001", "turn_1")
    await check_call(gate, call("list_orders", {"limit": "five"}), "cus_1001", "turn_1")
    assert sample("roundtrip_gate_rejections_total", tool="cancel_order", reason="not_allowed") == invented + 1
    assert sample("roundtrip_gate_rejections_total", tool="unknown", reason="unknown_tool") == unknown + 1
    assert sample("roundtrip_gate_rejections_total", tool="list_orders", reason="invalid_input") == invalid + 1
    assert (
        REGISTRY.get_sample_value(
            "roundtrip_gate_rejections_total", {"tool": "drop_database_now", "reason": "unknown_tool"}
        )
        is None
    )


async def test_tool_executions_are_counted_ok_or_error_with_their_latency():
    async def ok(tool_input, ctx):
        return {"fine": True}

    async def fails(tool_input, ctx):
        raise ToolError("order not found")

    handlers = {"t_ok": ok, "t_fails": fails}
    runner = tool_runner(
        SimpleNamespace(handler=lambda name: handlers[name], is_serial=lambda name: False), Dependencies(), timeout_s=1
    )
    before = {
        (t, r): sample("roundtrip_tool_executions_total", tool=t, result=r) for t in handlers for r in ("ok", "error")
    }
    timed = sample("roundtrip_tool_duration_seconds_count", tool="t_ok")
    calls = [
        CheckedCall(id="a", name="t_ok", input={}, approved=True),
        CheckedCall(id="b", name="t_fails", input={}, approved=True),
        CheckedCall(id="c", name="t_ok", input={}, approved=False, error="rejected"),
    ]  # rejected: not an execution
    await runner.run(calls, turn())
    assert sample("roundtrip_tool_executions_total", tool="t_ok", result="ok") == before[("t_ok", "ok")] + 1
    assert sample("roundtrip_tool_executions_total", tool="t_fails", result="error") == before[("t_fails", "error")] + 1
    assert sample("roundtrip_tool_duration_seconds_count", tool="t_ok") == timed + 1
