"""The example carrier agent (examples/telecom-agent) in-process: it fits together, its ownership rule (holder and
family-plan members see a line, only the holder changes it) holds through the gate's own check, porting out always
waits for a person, and a port-out happens once per idempotency key."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from roundtrip import ToolContext, ToolError
from roundtrip._gate.authorization import authorize
from roundtrip._kernel.settings import Settings
from roundtrip._sdk.context import Dependencies
from roundtrip._sdk.texts import gate_message

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "telecom-agent"))
from telecom_agent import AGENT, REPLIES  # noqa: E402
from telecom_agent.carrier import Carrier  # noqa: E402


@pytest.fixture
async def deps(tmp_path):
    opened = AGENT.open_dependencies(Settings(_env_file=None, state_dir=tmp_path))
    yield opened
    await opened.aclose()


def ctx(customer: str, deps: Dependencies, key: str = "idem_1") -> ToolContext:
    return ToolContext(customer_id=customer, tool_use_id="toolu_1", idempotency_key=key, deps=deps)


async def check(tool: str, args: dict, customer: str, deps: Dependencies) -> str | None:
    registry = AGENT.registry

    async def lookup(kind: str, entity_id: str, customer_id: str):
        return await registry.entity_resolver(kind)(entity_id, ctx(customer_id, deps))

    spec = registry.get(tool)
    return await authorize(
        spec, args, ctx(customer, deps), lookup, registry.policy(tool), {}, gate_message, registry.specs
    )


def test_the_agent_fits_together_with_its_own_prompt_replies_and_a_rule_that_always_holds():
    agent = AGENT.check()
    assert agent.name == "telco-support" and agent.system_prompt.startswith("You are Telco's")
    assert agent.registry.names == ["change_plan", "get_line", "list_lines", "port_out_number"]
    assert agent.holds_calls() and agent.replies == REPLIES
    reason = agent.registry.approval_rule("port_out_number")({"line_id": "ln_5550101"}, {}, agent.own_settings)
    assert "a person confirms every port-out" in reason


async def test_a_line_is_seen_by_its_holder_and_members_and_changed_by_its_holder_only(deps):
    assert await check("get_line", {"line_id": "ln_5550101"}, "cus_2001", deps) is None  # Alice holds it
    assert await check("get_line", {"line_id": "ln_5550101"}, "cus_2002", deps) is None  # Bob shares it
    for customer, line in (("cus_2003", "ln_5550101"), ("cus_2001", "ln_9999999")):  # Carol's is not Alice's; invented
        assert "was not found among this customer's lines" in await check("get_line", {"line_id": line}, customer, deps)
    assert await check("change_plan", {"line_id": "ln_5550101", "plan": "basic"}, "cus_2001", deps) is None
    denied = await check("change_plan", {"line_id": "ln_5550101", "plan": "basic"}, "cus_2002", deps)
    assert "only the account holder can change it" in denied
    listed = await AGENT.registry.handler("list_lines")({}, ctx("cus_2002", deps))
    assert [(line["line_id"], line["your_role"]) for line in listed["lines"]] == [
        ("ln_5550101", "member"),
        ("ln_5550202", "holder"),
    ]


async def test_a_port_out_happens_once_per_key_and_never_for_a_member(deps, tmp_path):
    port = AGENT.registry.handler("port_out_number")
    with pytest.raises(ToolError, match="not an active line this customer holds"):
        await port({"line_id": "ln_5550101", "new_carrier": "OtherTel"}, ctx("cus_2002", deps))
    first = await port({"line_id": "ln_5550101", "new_carrier": "OtherTel"}, ctx("cus_2001", deps, "idem_a"))
    again = await port({"line_id": "ln_5550101", "new_carrier": "OtherTel"}, ctx("cus_2001", deps, "idem_a"))
    assert first == again and first["ported"] and len(first["transfer_code"]) == 8
    other = Carrier(tmp_path / "telecom.db")  # another process opening the same file sees it
    assert (await other.line_for("cus_2001", "ln_5550101"))["status"] == "ported_out"
    await other.aclose()


async def test_the_harness_runs_a_scripted_three_step_turn_of_the_carrier_agent(deps):
    """Issue 19's bar for the authors' harness: a three-step turn of the example agent, in-process, well under 1 s."""
    import time

    from roundtrip.testing import ScriptedModel, arun_turn, call

    model = ScriptedModel(
        [
            call("list_lines"),
            call("change_plan", line_id="ln_5550101", plan="basic"),
            "Your line ln_5550101 is on the basic plan now.",
        ]
    )
    started = time.perf_counter()
    result = await arun_turn(AGENT, "cus_2001", "Move my line to the basic plan", model, deps=deps)
    seconds = time.perf_counter() - started
    assert (result.outcome, result.steps) == ("end_turn", 3), result.detail
    listed, changed = result.calls
    assert listed.ok and changed.ok, (listed.content, changed.content)
    member = await arun_turn(
        AGENT,
        "cus_2002",
        "Move the shared line to basic",  # Bob shares it, does not hold it
        ScriptedModel([call("change_plan", line_id="ln_5550101", plan="unlimited"), "I could not."]),
        deps=deps,
    )
    assert member.calls[0].is_error and "only the account holder" in member.calls[0].content
    print(f"\nthree-step turn of the carrier agent in-process: {seconds * 1000:.1f} ms")
