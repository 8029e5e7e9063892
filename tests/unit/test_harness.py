"""The agent authors' harness (services/testing/__init__.py): a turn through the fleet's own gate, guard rules and
executor, with a scripted model, against the real demo shop app in-process (SQLite), no Kafka."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import ClassVar

import pytest

from roundtrip import always
from roundtrip.testing import (
    AWAITING_APPROVAL,
    FunctionModel,
    ScriptedModel,
    ScriptExhausted,
    arun_turn,
    call,
    reply,
    run_turn,
)
from tests.agents import SHOP

ALICE, BOB = "cus_1001", "cus_1002"
PENDING = "ord_a1000003"  # Alice's pending order


def three_steps() -> ScriptedModel:
    return ScriptedModel(
        [
            call("list_orders", status="pending"),
            call("cancel_order", order_id=PENDING, reason="customer_request"),
            f"I cancelled {PENDING}.",
        ]
    )


async def test_a_scripted_three_step_turn_of_the_shop_agent_runs_through_the_gate_and_the_executor(shop):
    result = await arun_turn(SHOP, ALICE, "Cancel my pending order", three_steps(), deps={"shop": shop})
    assert (result.outcome, result.steps, result.text) == ("end_turn", 3, f"I cancelled {PENDING}.")
    listed, cancelled = result.calls
    assert listed.ok and [o["order_id"] for o in listed.result["orders"]] == [PENDING]
    assert cancelled.ok and cancelled.result["cancelled"] is True
    assert (await shop.get_order(ALICE, PENDING))["status"] == "cancelled"  # the handler really ran, once
    assert [m["role"] for m in result.transcript] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    seconds = []
    for _ in range(5):  # the figure for the report (not asserted: the machine is shared), of a turn that reads only
        reads = ScriptedModel(
            [call("list_orders"), call("get_shipping_status", order_id="ord_a1000002"), "It is on its way."]
        )
        started = time.perf_counter()
        again = await arun_turn(SHOP, ALICE, "Where is my parcel?", reads, deps={"shop": shop})
        seconds.append(time.perf_counter() - started)
        assert again.outcome == "end_turn" and all(c.ok for c in again.calls)
    print(
        f"\nthree-step turn of the shop agent in-process: median {statistics.median(seconds) * 1000:.1f} ms "
        f"(min {min(seconds) * 1000:.1f}, max {max(seconds) * 1000:.1f})"
    )


async def test_the_gate_refuses_another_customers_order_and_an_invalid_input_before_any_handler_runs(shop):
    model = ScriptedModel(
        [
            [call("cancel_order", order_id=PENDING, reason="customer_request"), call("lookup_order", order_id="ORD-1")],
            "I could not do that.",
        ]
    )
    result = await arun_turn(SHOP, BOB, "Cancel ord_a1000003", model, deps={"shop": shop})
    foreign, invalid = result.calls
    assert foreign.is_error and f"Order {PENDING} was not found among this customer's orders" in foreign.content
    assert invalid.is_error and invalid.content.startswith("Invalid input for lookup_order: `order_id`")
    assert (await shop.get_order(ALICE, PENDING))["status"] == "pending"


async def test_the_guards_rules_block_a_repeated_failing_call_and_end_the_turn(shop):
    again = call("lookup_order", order_id="ord_ffffffff")
    result = await arun_turn(
        SHOP, ALICE, "Where is ord_ffffffff?", ScriptedModel([again, again, again]), deps={"shop": shop}
    )
    assert result.outcome == "repeated_call" and result.steps == 3
    first, second = result.calls[:2]
    assert "was not found" in first.content and second.content.startswith("Not run: this exact call")


async def test_a_held_call_waits_for_a_person_or_runs_after_a_signed_decision(shop):
    asks = dataclasses.replace(SHOP, approvals={"cancel_order": always("a person checks every cancellation")})
    waiting = await arun_turn(asks, ALICE, "Cancel it", three_steps(), deps={"shop": shop})
    assert waiting.outcome == AWAITING_APPROVAL and waiting.held.call.name == "cancel_order"
    assert waiting.held.reason == "a person checks every cancellation"
    assert (await shop.get_order(ALICE, PENDING))["status"] == "pending"
    denied = await arun_turn(asks, ALICE, "Cancel it", three_steps(), deps={"shop": shop}, approve=False)
    assert denied.outcome == "end_turn" and "declined it" in denied.calls[1].content
    assert (await shop.get_order(ALICE, PENDING))["status"] == "pending"
    approved = await arun_turn(asks, ALICE, "Cancel it", three_steps(), deps={"shop": shop}, approve=True)
    assert approved.outcome == "end_turn" and approved.calls[1].ok and len(approved.approvals) == 1
    assert (await shop.get_order(ALICE, PENDING))["status"] == "cancelled"


async def test_a_function_model_reads_the_tool_results_and_sees_the_agents_tools(shop):
    def model(messages, info):
        assert info.system == SHOP.system_prompt and "cancel_order" in {t["name"] for t in info.tools}
        if info.step == 1:
            return call("list_orders", status="pending")
        if info.step == 2:
            (result,) = messages[-1]["content"]
            order = result["content"].split('"order_id": "')[1].split('"')[0]
            return ["Cancelling it now.", call("cancel_order", order_id=order, reason="customer_request")]
        return reply("Done, it is cancelled.", stop_reason="end_turn")

    scripted = FunctionModel(model)
    result = await arun_turn(SHOP, ALICE, "Cancel whatever is pending", scripted, deps={"shop": shop})
    assert result.outcome == "end_turn" and result.calls[1].input == {"order_id": PENDING, "reason": "customer_request"}
    assert len(scripted.requests) == 3


async def test_a_script_too_short_fails_the_test_saying_so_and_run_turn_wants_no_running_loop(shop):
    with pytest.raises(ScriptExhausted, match="asked for model response 2, the script has 1"):
        await arun_turn(SHOP, ALICE, "Hi", ScriptedModel([call("list_orders")]), deps={"shop": shop})
    with pytest.raises(RuntimeError, match="use `await arun_turn"):
        run_turn(SHOP, ALICE, "Hi", ScriptedModel(["Hello"]))


async def test_a_three_step_turn_of_an_agent_of_function_tools():
    from tests.unit.test_agent_authoring import agent

    desk = agent().check()
    script = [
        call("refund", ticket_id="T-1", cents=250),
        call("close_ticket", ticket_id="T-1", note="refunded"),
        "Refunded and closed.",
    ]
    started = time.perf_counter()
    result = await arun_turn(desk, "cus_1", "Refund and close T-1", ScriptedModel(script))
    seconds = time.perf_counter() - started
    assert (result.outcome, result.steps) == ("end_turn", 3)
    assert [c.result for c in result.calls] == [
        {"ticket_id": "T-1", "cents": 250},
        {"closed": "T-1", "note": "refunded", "urgent": False, "by": "cus_1"},
    ]
    refused = await arun_turn(
        desk, "cus_1", "Close X-9", ScriptedModel([call("close_ticket", ticket_id="X-9"), "No such ticket."])
    )
    assert refused.calls[0].is_error and "Ticket X-9 was not found" in refused.calls[0].content
    print(f"\nthree-step turn of a function-tool agent in-process: {seconds * 1000:.1f} ms")


# -- dependencies per process, as in the fleet (issue 29, item 2) --------------------------------------------------


class MemoryTickets:
    """An in-memory ticket desk: what the skeleton had before its backend became a file (each instance its own)."""

    made: ClassVar[list[MemoryTickets]] = []

    def __init__(self) -> None:
        self.tickets = {"T-1001": {"ticket_id": "T-1001", "customer_id": "cus_1", "status": "open", "subject": "s"}}
        self.used_by: set[str] = set()
        self.closed = False
        MemoryTickets.made.append(self)

    async def get(self, customer_id, ticket_id):
        self.used_by.add("gate")  # the resolver and the policy: the gate's process
        found = self.tickets.get(ticket_id)
        return dict(found) if found and found["customer_id"] == customer_id else None

    async def close(self, customer_id, ticket_id, note):
        self.used_by.add("executor")  # the handler: the executor's process
        self.tickets[ticket_id]["status"] = "closed"
        return dict(self.tickets[ticket_id])

    async def aclose(self):
        self.closed = True


@pytest.fixture
def skeleton_agent(tmp_path, monkeypatch):
    """The agent `roundtrip agent init` writes, imported from the folder it was written to."""
    from tests.skeletons import agent_files

    for relative, text in agent_files("desk-kind").items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    from desk_kind.agent import AGENT

    return AGENT


def close_twice() -> ScriptedModel:
    return ScriptedModel([call("close_ticket", ticket_id="T-1001"), call("close_ticket", ticket_id="T-1001"), "Done."])


def test_the_gate_and_the_executor_get_an_instance_each_of_every_dependency_made_and_closed(skeleton_agent, tmp_path):
    MemoryTickets.made = []
    agent = dataclasses.replace(skeleton_agent, dependencies={"tickets": lambda fleet, own: MemoryTickets()})
    run_turn(agent, "cus_1", "Close T-1001", close_twice(), state_dir=tmp_path)
    gate, executor = MemoryTickets.made  # two instances, as two processes would make them
    assert gate is not executor and (gate.used_by, executor.used_by) == ({"gate"}, {"executor"})
    assert gate.closed and executor.closed


def test_a_policy_reading_state_a_handler_changed_misbehaves_in_the_harness_as_in_the_fleet_unless_shared(
    skeleton_agent, tmp_path
):
    in_memory = dataclasses.replace(skeleton_agent, dependencies={"tickets": lambda fleet, own: MemoryTickets()})
    stale = run_turn(in_memory, "cus_1", "Close T-1001 twice", close_twice(), state_dir=tmp_path)
    assert [c.ok for c in stale.calls] == [True, True]  # the gate's instance never saw the first close: both ran
    shared = run_turn(skeleton_agent, "cus_1", "Close T-1001 twice", close_twice(), state_dir=tmp_path)  # one file
    assert shared.calls[0].ok and shared.calls[1].is_error and "already closed" in shared.calls[1].content
    one = run_turn(in_memory, "cus_1", "Close T-1001 twice", close_twice(), deps={"tickets": MemoryTickets()})
    assert one.calls[1].is_error  # a test that passes its own deps shares them: one instance for both
