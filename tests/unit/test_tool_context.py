"""A tool handler reads the request's metadata (the app's own facts) on its ToolContext, as the app sent it."""

from __future__ import annotations

import json

from roundtrip._gate.gate import Gate
from roundtrip._kernel.wire.events import CheckedCall, CheckToolCalls, ToolCall, Turn
from roundtrip._sdk.context import ToolContext
from roundtrip._shop.agent import AGENT as SHOP
from tests.agents import shop_deps, shop_registry, tool_runner
from tests.signing import pair


def _turn(metadata):
    return Turn(
        turn_id="turn_1", request_id="req_1", conversation_id="conv_1", customer_id="cus_1001", metadata=metadata
    )


async def _seen_by_the_handler(turn: Turn) -> dict:
    seen: dict = {}

    async def handler(args, ctx: ToolContext):
        seen.update(customer_id=ctx.customer_id, metadata=ctx.metadata)
        return {"ok": True}

    registry = shop_registry(handlers={**SHOP.handlers, "search_help_center": handler})
    runner = tool_runner(registry, shop_deps(None))
    (result,) = await runner.run(
        [CheckedCall(id="toolu_1", name="search_help_center", input={"query": "x"}, approved=True)], turn
    )
    assert json.loads(result["content"]) == {"ok": True}
    return seen


async def test_the_request_metadata_reaches_the_tool_context_of_the_executor():
    seen = await _seen_by_the_handler(_turn({"locale": "de", "tier": "gold", "channel": {"kind": "web"}}))
    assert seen == {"customer_id": "cus_1001", "metadata": {"locale": "de", "tier": "gold", "channel": {"kind": "web"}}}


async def test_a_request_without_metadata_gives_its_tools_an_empty_one():
    assert (await _seen_by_the_handler(_turn(None)))["metadata"] == {}


def test_a_tool_context_made_without_metadata_has_an_empty_one():
    assert ToolContext(customer_id="c", tool_use_id="t", idempotency_key="k").metadata == {}


async def test_a_policy_at_the_gate_reads_the_request_metadata_too():
    async def gold_only(tool_input, entities, ctx: ToolContext):
        return None if ctx.metadata.get("tier") == "gold" else "only for gold customers"

    async def lookup(kind, entity_id, customer_id):
        raise AssertionError("search_help_center references no entity")

    registry = shop_registry(policies={**SHOP.policies, "search_help_center": gold_only})
    gate = Gate(registry=registry, lookup=lookup, signer=pair("k1").signer)
    call = ToolCall(id="toolu_1", name="search_help_center", input={"query": "refunds"}, fingerprint="f")

    async def checked(metadata):
        batch = await gate.check(CheckToolCalls(turn=_turn(metadata), step=1, messages=[], calls=[call]))
        return batch.calls[0]

    assert (await checked({"tier": "gold"})).approved
    refused = await checked({"tier": "basic"})
    assert not refused.approved and "only for gold customers" in refused.error
