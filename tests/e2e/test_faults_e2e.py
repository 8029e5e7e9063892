"""Faults end to end (issue 8): nothing runs after a turn has ended, forged batches are always
dead-lettered and logged, an oversized model response does not stall the turn.

The whole fleet as processes over the real broker, driven through support.requests.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx

from roundtrip._kernel.settings import DEV_BATCH_SIGNING_KEY
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.approvals import Signer, Verifier
from roundtrip._kernel.wire.events import CheckedCall, ExecuteToolBatch, Outcome
from tests.e2e.test_guard_e2e import roundtrip_cli

CANCELLABLE = {"pending", "processing"}


def _customer_with_a_cancellable_order(shop_orders, settings) -> str:
    for _ in range(2):
        owners = sorted(
            {
                owner
                for owner, status in shop_orders().values()
                if status in CANCELLABLE and owner in ("cus_1001", "cus_1003")
            }
        )
        if owners:
            return owners[0]
        httpx.post(f"{settings.shop_base_url}/admin/reset", timeout=10)  # earlier tests cancelled them all
    raise AssertionError("no cancellable order even after a reset")


async def _logged(settings, text: str, timeout: float) -> list[str]:
    """Lines of the executors' logs containing `text`, once there is one (polled: no message announces it)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [
            line
            for p in (settings.state_dir / "logs").glob("executor*.log")
            for line in p.read_text(errors="replace").splitlines()
            if text in line
        ]
        if lines or time.monotonic() > deadline:
            assert lines, f"no executor logged {text!r} within {timeout:g} s"
            return lines
        await asyncio.sleep(0.2)  # poll interval: the executors' logs


def _executors(fleet) -> list:
    return [c.process for c in fleet.sync.children if c.name == "executor" or c.name.startswith("executor-")]


async def test_a_cancel_while_a_signed_batch_waits_means_the_batch_never_runs(
    client, fleet, fleet_settings, shop_orders
):
    settings = fleet_settings[0]
    customer = _customer_with_a_cancellable_order(shop_orders, settings)
    # model calls take 1.5 s, so the executors can be paused between step 1's results and step 2's batch
    async with fleet.reconfigured(("simulator",), simulator_latency_ms=1500):
        before = shop_orders()
        request_id = await client.ask("cancel my last order", customer=customer, persona="careful")
        # step 1's results are on their way to the model: pause every executor now
        await client.wait_for(
            lambda: [c for c in client.of_turn(topics.MODEL_CALLS, request_id) if c["step"] == 1], timeout=60
        )
        executors = _executors(fleet)
        for process in executors:
            os.kill(process.pid, signal.SIGSTOP)
        try:
            batches = await client.wait_for(
                lambda: [
                    b
                    for b in client.of_turn(topics.TOOL_BATCHES, request_id)
                    if any(c["name"] == "cancel_order" and c["approved"] for c in b["calls"])
                ],
                timeout=30,
            )
            turn_id = batches[0]["turn"]["turn_id"]
            assert (
                batches[0]["expires_at"] == batches[0]["turn"]["deadline_at"] > time.time()
            )  # signed with the turn's deadline
            cancelled = await asyncio.to_thread(roundtrip_cli, fleet_settings, "turns", "cancel", turn_id)
            assert cancelled.returncode == 0, cancelled.stderr
            reply = await client.reply(request_id, timeout=30)
            assert reply.outcome is Outcome.CANCELLED
        finally:
            for process in executors:
                os.kill(process.pid, signal.SIGCONT)
        # the executors now reach the signed cancel_order batch: the fence refuses it
        refused = await _logged(settings, f"turn {turn_id} step 2: not run", timeout=90)  # after a rebalance, maybe
        assert "ended, been cancelled" in refused[0]
        await client.settled()  # the executors committed past the batch they refused
    assert shop_orders() == before  # the order was NOT cancelled
    assert len(client.replies[request_id]) == 1  # exactly one reply
    assert not [
        c for c in client.of_turn(topics.MODEL_CALLS, request_id) if c["step"] >= 2
    ]  # and no model call after the end


async def test_a_forged_batch_reusing_a_real_turn_and_step_is_dead_lettered_and_logged(
    client, fleet_settings, shop_orders
):
    settings = fleet_settings[0]
    request_id = await client.ask("what are my orders?", customer="cus_1001", persona="careful")
    await client.reply(request_id)
    real = ExecuteToolBatch.model_validate(client.of_turn(topics.TOOL_BATCHES, request_id)[0])
    Verifier.of(settings.batch_verify_keys, "ROUNDTRIP_BATCH_VERIFY_KEYS").verify(real)  # the genuine batch of step 1
    before = shop_orders()
    victim = next(oid for oid, (owner, _) in sorted(before.items()) if owner == "cus_1002")
    attack = CheckedCall(
        id="toolu_forged01", name="cancel_order", input={"order_id": victim, "reason": "other"}, approved=True
    )
    tampered = real.model_copy(update={"calls": [attack]})  # the real signature, another call: a mismatch
    dev_signed = Signer.of(DEV_BATCH_SIGNING_KEY, "ROUNDTRIP_BATCH_SIGNING_KEY").sign(
        real.model_copy(update={"calls": [attack]})
    )  # the published key
    conversation = real.turn.conversation_id
    for batch in (tampered, dev_signed):
        await client.producer.send_and_wait(
            client.topic(topics.TOOL_BATCHES), batch.model_dump_json().encode(), key=conversation.encode()
        )

    def letters():
        found = [
            letter
            for letter in client.seen[topics.DEAD_LETTERS]
            if letter.get("key") == conversation and letter["service"] == "executor"
        ]
        return found if len(found) >= 2 else None

    found = await client.wait_for(letters, timeout=30)
    reasons = sorted(letter["reason"] for letter in found)
    assert "signature mismatch" in reasons[0] + reasons[1] and "unknown key id 'dev1'" in reasons[0] + reasons[1], (
        reasons
    )
    assert all("toolu_forged01" in letter["payload"] for letter in found)
    logged = await _logged(settings, f"refused batch for turn {real.turn.turn_id!r} step 1", timeout=10)
    security = [line for line in logged if "roundtrip.security" in line]
    assert len(security) >= 2, logged
    await client.settled()  # the forged batches handled: a (wrong) run would have reached the shop
    assert shop_orders() == before


async def _oversized_turn(client, persona: str) -> tuple[object, float, list[dict]]:
    started = time.monotonic()
    request_id = await client.ask("help me with my order", customer="cus_1001", persona=persona)
    reply = await client.reply(request_id, timeout=30)
    elapsed = time.monotonic() - started
    results = [
        b
        for c in client.of_turn(topics.MODEL_CALLS, request_id)
        for m in c["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    return reply, elapsed, results


async def test_an_oversized_or_too_deep_tool_input_becomes_an_error_result_and_the_loop_goes_on(
    client, fleet, fleet_settings, capsys
):
    deep, deep_s, deep_results = await _oversized_turn(client, "deep")
    # a model allowed to write ~600 kB (150k output tokens, ~$2.30: over the default $0.50 budget, which ends a turn)
    async with fleet.reconfigured(("model", "guard"), max_tokens=200_000, turn_budget_usd=10.0):
        big, big_s, big_results = await _oversized_turn(client, "bloated")
    for reply, results, problem in (
        (deep, deep_results, "input nested too deep: more than 32 levels"),
        (big, big_results, "input too large: "),
    ):
        assert reply.outcome is Outcome.END_TURN, reply  # not a deadline
        assert reply.steps == 2 and reply.usage.output_tokens > 0 and reply.cost_usd > 0  # both billed calls counted
        assert len(results) == 1 and results[0]["is_error"] and problem in results[0]["content"], results
    assert "limit 65536" in big_results[0]["content"] and big.usage.output_tokens > 100_000
    with capsys.disabled():
        print(
            f"\n[faults] deep tool input: reply in {deep_s:.2f} s; bloated (~600 kB) tool input: reply in {big_s:.2f} s"
        )
    assert deep_s < 10 and big_s < 10  # two model calls and one round trip, far from the stuck rule's 60-90 s
