"""Turns as an operator finds them in a real Jaeger v2: one trace per turn, rooted at the turn span, shallow.

The fleet runs as processes with ROUNDTRIP_OTLP_ENDPOINT pointing at a real Jaeger (the binary that
`bash scripts/jaeger.sh build` caches; `.ci/run` builds it). Three turns: a normal one (3 steps), a
runaway (persona stubborn, ended by the guard) and a stuck one (its executors killed: flagged stuck,
then ended with `deadline`). Each is found through Jaeger's query API by tag (roundtrip.turn_id), by
outcome (roundtrip.outcome), and the stuck one by minDuration and by error=true.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid

import pytest

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.observability.telemetry import turn_span_name
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.events import Outcome
from tests.e2e.conftest import AsyncFleet, FleetClient, fleet_env
from tests.jaeger import Jaeger, jaeger_binary
from tests.signing import key_settings

TURN_SPAN_NAME = turn_span_name("support-agent")  # the demo agent the fleet runs

UNAVAILABLE = os.environ.get(
    "ROUNDTRIP_JAEGER_UNAVAILABLE"
)  # .ci/run says why when it could not build Jaeger (no usable Go)
if jaeger_binary() is None and not UNAVAILABLE and os.environ.get("CI"):
    raise RuntimeError("CI without the Jaeger binary: .ci/run should have built it (bash scripts/jaeger.sh build)")
pytestmark = [
    pytest.mark.jaeger,
    pytest.mark.skipif(
        jaeger_binary() is None,
        reason=f"JAEGER v2 NOT BUILT ({UNAVAILABLE or 'run: bash scripts/jaeger.sh build'}); "
        "the Jaeger e2e tests did not run",
    ),
]

STUCK_AFTER_S, STUCK_GRACE_S = 4.0, 3.0
MAX_DEPTH = 6


def tags(span: dict) -> dict:
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def parent_of(span: dict) -> str | None:
    return next((r["spanID"] for r in span.get("references", []) if r["refType"] == "CHILD_OF"), None)


def depth(trace: dict) -> int:
    """The trace's maximum depth (the root is depth 1), following CHILD_OF references only (links are not parents)."""
    parents = {s["spanID"]: parent_of(s) for s in trace["spans"]}

    def level(span_id: str) -> int:
        n = 1
        while (span_id := parents.get(span_id)) is not None:
            n += 1
        return n

    return max(level(s) for s in parents)


def service(trace: dict, span: dict) -> str:
    return trace["processes"][span["processID"]]["serviceName"]


def search(jaeger: Jaeger, **params) -> list[dict]:
    if "tags" in params:
        params["tags"] = json.dumps(params["tags"])
    return jaeger.traces("roundtrip-gateway", limit=100, lookback="1h", **params)


def trace_ids(traces: list[dict]) -> set[str]:
    return {t["traceID"] for t in traces}


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory):
    with Jaeger(log_file=tmp_path_factory.mktemp("jaeger") / "jaeger.log") as running:
        yield running


@pytest.fixture(scope="module")
def traced(kafka_bootstrap, tmp_path_factory, jaeger):
    state = tmp_path_factory.mktemp("traced-fleet")
    values = dict(
        otlp_endpoint=jaeger.otlp_http_endpoint,
        jaeger_query_url=jaeger.query_url,
        kafka_bootstrap_servers=kafka_bootstrap,
        kafka_allow_plaintext=True,  # the test broker listens in the clear; the fleet is not development
        topic_prefix=f"jg{uuid.uuid4().hex[:6]}.",
        state_dir=state,
        simulator_port=free_port(),
        console_port=free_port(),
        shop_port=free_port(),
        partitions=2,
        stuck_after_s=STUCK_AFTER_S,
        stuck_grace_s=STUCK_GRACE_S,
        log_level="INFO",
        # not the embedded broker, so not "development": the published development key would be refused
        **key_settings("jg1"),  # fresh pairs, never the published development keys
    )
    # spans leave each process within 0.3 s (the SDK's default is 5 s): a SIGKILLed executor loses less, tests wait less
    settings, env = Settings(**values), {**fleet_env(**values), "OTEL_BSP_SCHEDULE_DELAY": "300"}
    with Fleet(settings, env=env, executor_replicas=1) as fleet:
        yield AsyncFleet(fleet), settings, env


def ask_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "ask", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
async def turns(traced, jaeger):
    fleet, settings, env = traced
    client = FleetClient(settings)
    await client.start()
    try:
        normal = await client.reply(await client.ask("cancel my last order", customer="cus_1001", persona="careful"))
        runaway = await client.reply(
            await client.ask("where is my order ord_0000dead?", customer="cus_1003", persona="stubborn")
        )
        # the executor is killed next (SIGKILL: spans not yet exported are lost): let it export the first turns' spans
        await wait_trace(
            jaeger,
            normal.trace_id,
            lambda t: any(s["operationName"] == "execute_tool cancel_order" for s in t["spans"]),
        )
        await fleet.kill("executor")
        try:  # `roundtrip ask`, as an operator would, while no executor runs: flagged stuck, then ended
            started = time.monotonic()
            asked = await asyncio.to_thread(
                ask_cli, env, "where is my order?", "--customer", "cus_1002", "--persona", "careful", "--timeout", "60"
            )
            stuck_wall = time.monotonic() - started
        finally:
            await fleet.respawn("executor")  # it finds the stale batch: the approval has expired, nothing runs
        assert asked.returncode == 3, (
            asked.stdout + asked.stderr
        )  # the guard ended it (deadline): ask says so in its exit code
        assert "the turn did not end with the model's answer: deadline (exit code 3)" in asked.stdout
        turn_id = re.search(r"turn (turn_[0-9a-f]+)\s+trace", asked.stdout).group(1)
        stuck = await client.wait_for(
            lambda: next((r for rs in client.replies.values() for r in rs if r.turn_id == turn_id), None), 30
        )
        yield {"normal": normal, "runaway": runaway, "stuck": stuck, "ask": asked.stdout, "stuck_wall": stuck_wall}
    finally:
        await client.stop()


async def wait_trace(jaeger: Jaeger, trace_id: str, ready, timeout: float = 30.0) -> dict:
    """The trace once `ready(trace)` holds (spans arrive in batches from five processes)."""
    deadline = time.monotonic() + timeout
    while True:
        found = await asyncio.to_thread(jaeger.trace, trace_id)
        if found is not None and ready(found):
            return found
        assert time.monotonic() < deadline, f"trace {trace_id} not complete in Jaeger: " + (
            ", ".join(sorted(s["operationName"] for s in found["spans"])) if found else "absent"
        )
        await asyncio.sleep(0.5)  # poll interval: the trace in Jaeger's query API


def has_root(trace: dict) -> bool:
    return any(s["operationName"] == TURN_SPAN_NAME for s in trace["spans"])


async def test_the_turns_ended_as_their_scenario_says(turns):
    assert turns["normal"].outcome is Outcome.END_TURN and turns["normal"].steps == 3
    assert turns["runaway"].outcome is Outcome.REPEATED_CALL
    assert turns["stuck"].outcome is Outcome.DEADLINE


async def test_roundtrip_ask_says_when_its_turn_is_stuck_and_which_hop_it_waits_on(turns):
    out = turns["ask"]
    assert re.search(r"turn turn_[0-9a-f]+ is stuck", out), out
    assert "waiting on an executor (turn.tool_batches)" in out, out
    assert "deadline" in out  # and then the polite reply


async def test_each_turn_is_found_by_its_turn_id_and_by_its_outcome(turns, jaeger):
    for name, outcome in (("normal", "end_turn"), ("runaway", "repeated_call"), ("stuck", "deadline")):
        reply = turns[name]
        await wait_trace(jaeger, reply.trace_id, has_root)
        by_turn = search(jaeger, tags={"roundtrip.turn_id": reply.turn_id})
        assert trace_ids(by_turn) == {reply.trace_id}, name
        by_outcome = trace_ids(search(jaeger, tags={"roundtrip.outcome": outcome}))
        assert reply.trace_id in by_outcome, name
        others = {turns[o].trace_id for o in ("normal", "runaway", "stuck") if o != name}
        assert not others & by_outcome, f"{name}: another turn found by outcome {outcome}"


async def test_the_stuck_turn_is_found_by_min_duration_and_by_error(turns, jaeger):
    stuck, normal, runaway = turns["stuck"], turns["normal"], turns["runaway"]
    for reply in (stuck, normal, runaway):
        await wait_trace(jaeger, reply.trace_id, has_root)
    long_ones = trace_ids(search(jaeger, minDuration=f"{STUCK_AFTER_S:g}s"))
    assert stuck.trace_id in long_ones
    assert normal.trace_id not in long_ones and runaway.trace_id not in long_ones
    failed = trace_ids(search(jaeger, tags={"roundtrip.error": "true"}))  # works on every storage
    assert stuck.trace_id in failed and runaway.trace_id in failed
    assert normal.trace_id not in failed  # a turn that went well shows no error


async def test_jaeger_cannot_search_error_true_so_the_stuck_turn_is_found_by_roundtrip_error(turns, jaeger):
    """A defect of Jaeger 2.13's in-memory storage, asserted as it is (not an expected failure, which any other error
    would pass as too): the query API passes the tag `error=true` as the string 'true' and the store reads it as a
    boolean (false), so the stuck turn is not found that way; `roundtrip.error=true` finds it. When a Jaeger version
    fixes it, this fails: then `error=true` may be advised again."""
    stuck = turns["stuck"].trace_id
    await wait_trace(jaeger, stuck, has_root)
    assert stuck in trace_ids(search(jaeger, tags={"roundtrip.error": "true"}))
    assert stuck not in trace_ids(search(jaeger, tags={"error": "true"}))


async def test_a_three_step_turn_is_one_shallow_trace_rooted_at_the_turn_span(turns, jaeger, capsys):
    reply = turns["normal"]
    conversation = reply.conversation_id

    def complete(t: dict) -> bool:
        names = [s["operationName"] for s in t["spans"]]
        return (
            has_root(t)
            and names.count("anthropic.messages.create") == 3
            and any(n.endswith("turn.outcomes process") for n in names)
        )

    trace = await wait_trace(jaeger, reply.trace_id, complete)
    spans = trace["spans"]
    ids = {s["spanID"] for s in spans}
    roots = [s for s in spans if parent_of(s) is None]
    assert [s["operationName"] for s in roots] == [TURN_SPAN_NAME]
    root = roots[0]
    assert service(trace, root) == "roundtrip-gateway"
    assert all(parent_of(s) in ids for s in spans if s is not root), "every span's parent is in the trace (no orphans)"

    # the root lasts the turn: from the request (before any span) to the reply (after the last hop but the reply's)
    first = min(s["startTime"] for s in spans)
    assert root["startTime"] == first
    # (a span that starts after the reply is a redelivery after some other test's SIGKILL: at least once, refused
    # by the fence; it belongs to the trace but not to the turn's time)
    end = root["startTime"] + root["duration"]
    late = [
        (service(trace, s), s["operationName"], (s["startTime"] + s["duration"] - end) // 1000)
        for s in spans
        if s["startTime"] < end and s["startTime"] + s["duration"] > end + 50_000
    ]
    assert not late, f"spans of the turn that end after its span (service, name, ms after): {late}"

    measured = depth(trace)
    with capsys.disabled():
        print(
            f"\n[jaeger] 3-step turn: {len(spans)} spans from {len({service(trace, s) for s in spans})} services, "
            f"maximum depth {measured}, turn span {root['duration'] / 1000:.0f} ms"
        )
    assert measured <= MAX_DEPTH

    # every span says which turn and conversation it belongs to; messaging spans carry our conversation id
    for span in spans:
        t = tags(span)
        assert t.get("roundtrip.turn_id") == reply.turn_id, span["operationName"]
        assert t.get("gen_ai.conversation.id") == conversation, span["operationName"]
        if "messaging.system" in t:
            assert t.get("messaging.message.conversation_id") == conversation, span["operationName"]

    # the turn span: GenAI invoke_agent with the turn's figures
    t = tags(root)
    assert t["gen_ai.operation.name"] == "invoke_agent" and t["gen_ai.agent.name"] == "support-agent"
    assert t["gen_ai.provider.name"] == "anthropic"
    assert (
        t["roundtrip.customer_id"] == "cus_1001" and t["roundtrip.outcome"] == "end_turn" and t["roundtrip.steps"] == 3
    )
    usage = reply.usage
    assert (
        t["gen_ai.usage.input_tokens"]
        == usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens
    )
    assert t["gen_ai.usage.output_tokens"] == usage.output_tokens
    assert t["roundtrip.cost_usd"] == pytest.approx(reply.cost_usd)

    # model calls (the SDK's own spans) and tool executions sit right under their hop, under the turn
    by_id = {s["spanID"]: s for s in spans}
    chats = [s for s in spans if s["operationName"] == "anthropic.messages.create"]
    assert sorted(tags(c)["roundtrip.step"] for c in chats) == [1, 2, 3]
    for chat in chats:
        assert parent_of(by_id[parent_of(chat)]) == root["spanID"]
    tools = [s for s in spans if s["operationName"].startswith("execute_tool ")]
    assert {tags(s)["gen_ai.tool.name"] for s in tools} == {"list_orders", "cancel_order"}
    assert all(tags(s)["gen_ai.operation.name"] == "execute_tool" and tags(s)["gen_ai.tool.call.id"] for s in tools)

    # every hop after the request is linked to the hop that caused it (FOLLOWS_FROM), parented to the turn span
    hops = [s for s in spans if tags(s).get("messaging.operation") == "process"]
    assert len(hops) >= 2 + 3 * 3 - 2  # requests, starts, 3 model calls, 3 iterations, 2 checks, 2 batches, outcomes
    for hop in hops:
        assert parent_of(hop) == root["spanID"], hop["operationName"]
        if not hop["operationName"].endswith("support.requests process"):  # the request's cause is the client's, if any
            links = [r["spanID"] for r in hop.get("references", []) if r["refType"] == "FOLLOWS_FROM"]
            assert links and all(link in ids for link in links), hop["operationName"]


async def test_the_stuck_turn_reads_as_a_story(turns, jaeger):
    reply = turns["stuck"]

    def complete(t: dict) -> bool:
        names = {s["operationName"] for s in t["spans"]}
        return (
            has_root(t)
            and {"guard.turn_stuck", "guard.deadline"} <= names
            and any(n.endswith("turn.tool_batches process") for n in names)
        )

    trace = await wait_trace(jaeger, reply.trace_id, complete, timeout=45)
    by_name = {}
    for s in trace["spans"]:
        by_name.setdefault(s["operationName"], []).append(s)
    root = by_name[TURN_SPAN_NAME][0]
    assert root["duration"] >= (STUCK_AFTER_S + STUCK_GRACE_S) * 1e6
    t = tags(root)
    assert t["roundtrip.outcome"] == "deadline" and t["error"] is True and t["error.type"] == "deadline"
    for name, why in (("guard.turn_stuck", "no progress"), ("guard.deadline", "stuck for more than")):
        (span,) = by_name[name]
        assert parent_of(span) == root["spanID"]
        assert tags(span)["error"] is True and why in tags(span)["roundtrip.detail"], name
    # the executor that came back found a batch of an ended turn (the fence refused it, or its approval
    # had expired): its span says why nothing ran, it is not a bare span
    (batch,) = [s for s in trace["spans"] if s["operationName"].endswith("turn.tool_batches process")]
    detail = tags(batch)["roundtrip.detail"]
    assert tags(batch)["error"] is True and ("nothing was run" in detail or "expired" in detail), detail
    assert not any(s["operationName"].startswith("execute_tool ") for s in trace["spans"])


async def test_roundtrip_trace_reads_the_turn_from_jaeger(turns, traced, jaeger):
    reply = turns["normal"]
    await wait_trace(jaeger, reply.trace_id, has_root)
    env = {**os.environ, **traced[2], "COLUMNS": "200"}
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "roundtrip._cli.main", "trace", reply.turn_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"trace {reply.trace_id}" in shown.stdout
    assert TURN_SPAN_NAME in shown.stdout and "execute_tool cancel_order" in shown.stdout
    assert {"gateway", "guard", "model", "gate", "executor"} <= set(
        re.findall(r"\b(gateway|guard|model|gate|executor)\b", shown.stdout)
    )
    # unreachable Jaeger: a clear error, not a traceback
    env["ROUNDTRIP_JAEGER_QUERY_URL"] = f"http://127.0.0.1:{free_port()}"
    down = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "roundtrip._cli.main", "trace", reply.turn_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert down.returncode == 2 and "cannot read Jaeger" in down.stdout
