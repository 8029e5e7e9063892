"""A tool handler reads the request's metadata (the app's own facts) on its ToolContext, as the app sent it."""

from __future__ import annotations

import json

from services.executor.runner import Runner
from services.kernel.events import CheckedCall, Turn
from services.shop.agent import AGENT as SHOP
from services.tools.context import ToolContext
from tests.agents import shop_deps, shop_registry


def _turn(metadata):
    return Turn(turn_id="turn_1", request_id="req_1", conversation_id="conv_1", customer_id="cus_1001", metadata=metadata)


async def _seen_by_the_handler(turn: Turn) -> dict:
    seen: dict = {}

    async def handler(args, ctx: ToolContext):
        seen.update(customer_id=ctx.customer_id, metadata=ctx.metadata)
        return {"ok": True}

    registry = shop_registry(handlers={**SHOP.handlers, "search_help_center": handler})
    runner = Runner(registry, deps=shop_deps(None), timeout_s=5, parallel=True)
    (result,) = await runner.run([CheckedCall(id="toolu_1", name="search_help_center", input={"query": "x"}, approved=True)], turn)
    assert json.loads(result["content"]) == {"ok": True}
    return seen


async def test_the_request_metadata_reaches_the_tool_context_of_the_executor():
    seen = await _seen_by_the_handler(_turn({"locale": "de", "tier": "gold", "channel": {"kind": "web"}}))
    assert seen == {"customer_id": "cus_1001", "metadata": {"locale": "de", "tier": "gold", "channel": {"kind": "web"}}}


async def test_a_request_without_metadata_gives_its_tools_an_empty_one():
    assert (await _seen_by_the_handler(_turn(None)))["metadata"] == {}


def test_a_tool_context_made_without_metadata_has_an_empty_one():
    assert ToolContext(customer_id="c", tool_use_id="t", idempotency_key="k").metadata == {}
