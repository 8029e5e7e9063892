"""Approvals by a person and parallel use, end to end (issue 11): the whole fleet as processes over the real
broker, the real SDK against the simulator, decisions made with `roundtrip approvals` or published raw.

The gate holds cancellations above 50.00 EUR (Alice's pending ord_a1000003 is 87.00 EUR); the guard's stuck
rule is set to 2 s + 2 s so that a waiting turn would be flagged and ended within seconds if it applied.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid

import httpx
import pytest

from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.approvals import Signer
from roundtrip._kernel.wire.events import ApprovalDecided, Decision, Outcome
from tests.e2e.test_guard_e2e import roundtrip_cli
from tests.signing import pair

APPROVAL_TIMEOUT_S = 25.0  # the listing CLIs (processes of their own, seconds each on a busy machine) run within it
ORDER = "ord_a1000003"


@pytest.fixture(scope="module")
async def approvals_on(fleet, fleet_settings):
    async with (
        fleet.reconfigured(("gate",), approval_cancel_above_cents=5000, approval_timeout_s=APPROVAL_TIMEOUT_S),
        fleet.reconfigured(("guard",), stuck_after_s=2.0, stuck_grace_s=2.0),
    ):
        yield


def _reset_shop(settings) -> None:
    httpx.post(f"{settings.shop_base_url}/admin/reset", timeout=10).raise_for_status()


def _status(shop_orders, order_id: str) -> str:
    return shop_orders()[order_id][1]


async def _waiting(client, request_id: str) -> dict:
    (request,) = await client.wait_for(lambda: client.of_turn(topics.APPROVAL_REQUESTS, request_id), timeout=60)
    return request


async def _told_waiting(client, request_id: str) -> dict:
    """The support.status that says the turn waits for a person: the guard has recorded it as awaiting."""
    (status,) = await client.wait_for(
        lambda: [
            s
            for s in client.seen[topics.SUPPORT_STATUS]
            if s["request_id"] == request_id and s["state"] == "waiting_for_approval"  # each step's `working` too
        ]
    )
    return status


def _tool_spans(settings, trace_id: str, name: str) -> list[dict]:
    path = settings.effective_span_file
    spans = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [s for s in spans if s["trace_id"] == trace_id and s["name"] == name]


async def _spans(settings, trace_id: str, name: str, count: int = 1, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    while len(found := _tool_spans(settings, trace_id, name)) < count:
        assert time.monotonic() < deadline, f"no {name!r} span in trace {trace_id}"
        await asyncio.sleep(0.5)  # poll interval: the spans written to the span file
    return found


async def test_a_cancellation_above_the_threshold_waits_is_never_stuck_and_runs_once_when_approved(
    approvals_on, client, fleet_settings, shop_orders
):
    settings = fleet_settings[0]
    _reset_shop(settings)
    request_id = await client.ask("cancel my last order", customer="cus_1001", persona="careful")
    request = await _waiting(client, request_id)
    turn_id, approval_id = request["turn"]["turn_id"], request["approval_id"]
    assert request["call"]["name"] == "cancel_order" and request["call"]["input"]["order_id"] == ORDER
    assert request["entities"]["order_id"]["total_cents"] == 8700 and request["turn"]["customer_id"] == "cus_1001"
    assert "87.00 EUR" in request["reason"] and request["turn"]["trace_id"]

    # the app is told, on support.status, that its turn waits for a person and until when
    status = await _told_waiting(client, request_id)
    assert status["state"] == "waiting_for_approval" and status["until"] == request["expires_at"]
    assert (status["turn_id"], status["approval_id"], status["customer_id"]) == (turn_id, approval_id, "cus_1001")

    # waiting: longer than the stuck rule's 2 s + 2 s grace, and nothing is flagged, ended or cancelled
    await asyncio.sleep(6)  # a timer's window, no record to wait on: the sweeper would have flagged it by now
    assert not [f for f in client.seen[topics.TURN_EVENTS] if f["turn"]["turn_id"] == turn_id]
    assert not client.replies.get(request_id) and _status(shop_orders, ORDER) == "pending"
    turns = await asyncio.to_thread(roundtrip_cli, fleet_settings, "turns", "--status", "awaiting")
    assert turns.returncode == 0 and turn_id in turns.stdout, turns.stdout + turns.stderr
    listed = await asyncio.to_thread(roundtrip_cli, fleet_settings, "approvals")
    assert approval_id in listed.stdout and f"cancel_order({ORDER})" in listed.stdout, listed.stdout + listed.stderr

    # a writer of turn.approval_requests copies the request for another customer, or a later deadline: the guard
    # records neither (the gate's signature of the hold covers both) and dead-letters them with the reason
    conversation = request["turn"]["conversation_id"]
    for forged in (
        request | {"turn": request["turn"] | {"customer_id": "cus_1002"}},
        request | {"expires_at": request["expires_at"] + 3600},
    ):
        await client.producer.send_and_wait(
            client.topic(topics.APPROVAL_REQUESTS), json.dumps(forged).encode(), key=conversation.encode()
        )

    def refused() -> list[dict] | None:
        seen = client.seen[topics.DEAD_LETTERS]
        found = [x for x in seen if x.get("key") == conversation and x["service"] == "guard"]
        return found if len(found) >= 2 else None

    letters = await client.wait_for(refused, timeout=30)
    assert len(letters) == 2 and all("signature mismatch" in x["reason"] for x in letters), letters

    approved = await asyncio.to_thread(
        roundtrip_cli, fleet_settings, "approvals", "approve", approval_id, "--by", "alice@support"
    )
    assert approved.returncode == 0, approved.stderr
    reply = await client.reply(request_id)
    assert reply.outcome is Outcome.END_TURN and f"cancelled order {ORDER}" in reply.text
    assert _status(shop_orders, ORDER) == "cancelled"

    # the same decision published twice more (any Kafka client can): nothing runs again
    (decision,) = [d for d in client.seen[topics.APPROVAL_DECISIONS] if d["approval_id"] == approval_id]
    for _ in range(2):
        await client.producer.send_and_wait(
            client.topic(topics.APPROVAL_DECISIONS),
            json.dumps(decision).encode(),
            key=request["turn"]["conversation_id"].encode(),
        )
    await client.settled()  # the copies of the decision handled: a second run would be on the batches topic
    resumed = [
        b for b in client.of_turn(topics.TOOL_BATCHES, request_id) if any(c.get("approved_by") for c in b["calls"])
    ]
    assert len(resumed) == 1 and resumed[0]["calls"][0]["approved_by"] == "alice@support"
    assert len(await _spans(settings, reply.trace_id, "execute_tool cancel_order")) == 1  # executed exactly once
    assert len(client.replies[request_id]) == 1

    # who decided and when: with the turn (ledger) and on its trace, where the wait is one span
    (wait,) = await _spans(settings, reply.trace_id, "approval.wait")
    attrs = wait["attributes"]
    assert attrs["roundtrip.decided_by"] == "alice@support" and attrs["roundtrip.decision"] == "approved"
    assert attrs["roundtrip.approval_id"] == approval_id and attrs["roundtrip.waited_s"] >= 6
    assert (wait["end_ns"] - wait["start_ns"]) / 1e9 >= 6
    everything = await asyncio.to_thread(roundtrip_cli, fleet_settings, "approvals", "--all")
    assert approval_id in everything.stdout and "approved" in everything.stdout and "alice@support" in everything.stdout


async def test_denied_the_order_is_not_cancelled_and_the_model_explains(
    approvals_on, client, fleet_settings, shop_orders
):
    _reset_shop(fleet_settings[0])
    conversation = f"conv_{uuid.uuid4().hex[:10]}"
    # asked with `roundtrip ask`, which shows the wait and the decision as they happen
    ask = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "roundtrip._cli.main",
        "ask",
        "cancel my last order",
        "--customer",
        "cus_1001",
        "--persona",
        "careful",
        "--conversation",
        conversation,
        "--timeout",
        "60",
        env={**os.environ, **fleet_settings[1]},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        (request,) = await client.wait_for(
            lambda: [r for r in client.seen[topics.APPROVAL_REQUESTS] if r["turn"]["conversation_id"] == conversation],
            timeout=60,
        )
        request_id = request["turn"]["request_id"]
        denied = await asyncio.to_thread(
            roundtrip_cli,
            fleet_settings,
            "approvals",
            "deny",
            request["approval_id"],
            "--reason",
            "a fraud review is open on this order",
            "--by",
            "bob@support",
        )
        assert denied.returncode == 0, denied.stderr
        out, err = await asyncio.wait_for(ask.communicate(), 60)
    finally:
        if ask.returncode is None:
            ask.kill()
            await ask.wait()
    shown = out.decode()
    assert ask.returncode == 0, shown + err.decode()
    assert f"waiting for approval of cancel_order({ORDER})" in shown and "denied by bob@support" in shown, shown
    reply = await client.reply(request_id)
    assert reply.outcome is Outcome.END_TURN
    assert "a fraud review is open on this order" in reply.text and "sorry" in reply.text.lower()
    assert _status(shop_orders, ORDER) == "pending"
    assert not [
        b for b in client.of_turn(topics.TOOL_BATCHES, request_id) if any(c.get("approved_by") for c in b["calls"])
    ]
    results = [
        b
        for c in client.of_turn(topics.MODEL_CALLS, request_id)
        for m in c["messages"][-1:]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("tool_use_id") == request["call"]["id"]
    ]
    assert results and results[-1]["is_error"] and "declined it" in results[-1]["content"]


async def test_no_decision_ends_the_turn_politely_and_late_forged_or_foreign_decisions_are_dead_lettered(
    approvals_on, client, fleet_settings, shop_orders
):
    settings = fleet_settings[0]
    _reset_shop(settings)
    started = time.monotonic()
    conversation_id = f"conv_{uuid.uuid4().hex[:10]}"
    # asked with `roundtrip ask --timeout 5`: it sees the wait on support.status and keeps waiting to the turn's end
    ask = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "roundtrip._cli.main",
        "ask",
        "cancel my last order",
        "--customer",
        "cus_1001",
        "--persona",
        "careful",
        "--conversation",
        conversation_id,
        "--timeout",
        "5",
        env={**os.environ, **fleet_settings[1]},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    (request,) = await client.wait_for(
        lambda: [r for r in client.seen[topics.APPROVAL_REQUESTS] if r["turn"]["conversation_id"] == conversation_id],
        timeout=60,
    )
    request_id = request["turn"]["request_id"]
    conversation = conversation_id.encode()
    signer = Signer.of(settings.key_text("decision_signing_key"), "ROUNDTRIP_DECISION_SIGNING_KEY")

    def decision(**overrides) -> bytes:
        values = dict(
            approval_id=request["approval_id"],
            turn_id=request["turn"]["turn_id"],
            tool_use_id=request["call"]["id"],
            input_sha256=request["input_sha256"],
            decision=Decision.APPROVE,
            decided_by="mallory",
            decided_at=time.time(),
        )
        return signer.sign(ApprovalDecided(**(values | overrides))).model_dump_json().encode()

    forged = (
        pair("ops1")  # a key of the attacker's own under the people's key id
        .signer.sign(ApprovalDecided.model_validate_json(decision()))
        .model_dump_json()
        .encode()
    )
    other_args = decision(input_sha256="0" * 64)  # validly signed, but for other arguments than the ones shown
    for value in (forged, other_args):
        await client.producer.send_and_wait(client.topic(topics.APPROVAL_DECISIONS), value, key=conversation)

    reply = await client.reply(request_id, timeout=APPROVAL_TIMEOUT_S + 30)
    assert reply.outcome is Outcome.APPROVAL_TIMEOUT and "could not be reviewed in time" in reply.text
    assert time.monotonic() - started >= APPROVAL_TIMEOUT_S - 1
    try:
        out, err = await asyncio.wait_for(ask.communicate(), 30)
    finally:
        if ask.returncode is None:
            ask.kill()
            await ask.wait()
    shown = out.decode()  # ask waited past its 5 s for the reply, and says how the turn ended
    assert ask.returncode == 3, shown + err.decode()
    assert "waiting_for_approval until" in shown and "approval_timeout" in shown and "no reply within" not in shown, (
        shown
    )
    assert _status(shop_orders, ORDER) == "pending"

    late = decision()  # a valid decision for a turn that has ended
    await client.producer.send_and_wait(client.topic(topics.APPROVAL_DECISIONS), late, key=conversation)

    def letters():
        found = [
            letter
            for letter in client.seen[topics.DEAD_LETTERS]
            if letter.get("key") == conversation.decode() and letter["service"] == "guard"
        ]
        return found if len(found) >= 3 else None

    reasons = " | ".join(letter["reason"] for letter in await client.wait_for(letters, timeout=30))
    assert "forged decision" in reasons and "decision for another call" in reasons and "expired" in reasons, reasons
    await client.settled()  # the forged decisions handled: a run of the cancel would have reached the shop
    assert _status(shop_orders, ORDER) == "pending" and len(client.replies[request_id]) == 1


async def test_with_parallel_use_disabled_by_the_request_the_parallel_persona_makes_one_call_per_response(
    client, fleet_settings
):
    settings = fleet_settings[0]
    health = f"http://127.0.0.1:{settings.simulator_port}/health"
    before = httpx.get(health, timeout=5).json()["parallel_disabled"]
    request_id = f"req_{uuid.uuid4().hex[:10]}"
    body = {
        "request_id": request_id,
        "conversation_id": f"conv_{request_id}",
        "customer_id": "cus_1001",
        "text": "where are my orders?",
        "persona": "parallel",
        "disable_parallel_tool_use": True,
    }
    await client.publish_raw(json.dumps(body).encode(), key=body["conversation_id"].encode())
    reply = await client.reply(request_id)
    iterations = client.of_turn(topics.ITERATIONS, request_id)
    assert reply.outcome is Outcome.END_TURN and len(iterations) == reply.steps >= 2
    assert all(len(i["tool_calls"]) <= 1 for i in iterations), [len(i["tool_calls"]) for i in iterations]
    assert (
        httpx.get(health, timeout=5).json()["parallel_disabled"] - before == reply.steps
    )  # every request carried the flag
    # the same question without the flag: several calls in one response
    again = await client.ask("where are my orders?", customer="cus_1001", persona="parallel")
    await client.reply(again)
    assert max(len(i["tool_calls"]) for i in client.of_turn(topics.ITERATIONS, again)) > 1


async def test_a_step_holding_a_serial_tool_runs_its_calls_in_tool_use_order(client, fleet_settings):
    settings = fleet_settings[0]
    request_id = await client.ask("I want to talk to a person", customer="cus_1003", persona="parallel")
    reply = await client.reply(request_id)
    assert reply.outcome is Outcome.END_TURN
    (step,) = [i for i in client.of_turn(topics.ITERATIONS, request_id) if len(i["tool_calls"]) > 1]
    assert [c["name"] for c in step["tool_calls"]] == ["escalate_to_human", "search_help_center"]
    (escalate,) = await _spans(settings, reply.trace_id, "execute_tool escalate_to_human")
    (search,) = await _spans(settings, reply.trace_id, "execute_tool search_help_center")
    assert escalate["end_ns"] <= search["start_ns"]  # one after the other, in the model's order
