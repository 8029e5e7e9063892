"""The demo shop's agent with its ownership rule removed: its resolver finds any customer's order by its id alone,
from a backend that does not say whose it is (so the gate's own check of an entity's customer_id has nothing to
compare), and its cancel policy checks only the status. tests/e2e/test_eval_e2e.py: the shop's evaluation suite
must fail exactly the cases that depend on the rule, and no other."""

from __future__ import annotations

import dataclasses
from typing import Any

from roundtrip import ToolContext
from roundtrip._shop.agent import AGENT as SHOP
from roundtrip._shop.agent.tools import CANCELLABLE, not_cancellable_message


async def any_customers_order(order_id: str, ctx: ToolContext) -> dict[str, Any] | None:
    found = next((o for o in await ctx.deps.shop.admin_orders() if o["order_id"] == order_id), None)
    return None if found is None else {k: v for k, v in found.items() if k not in ("customer_id", "customer_name")}


async def status_only(args: dict[str, Any], entities: dict[str, dict[str, Any]], ctx: ToolContext) -> str | None:
    order = entities["order_id"]
    return None if order["status"] in CANCELLABLE else not_cancellable_message(order["order_id"], order["status"])


AGENT = dataclasses.replace(SHOP, entities={"order": any_customers_order}, policies={"cancel_order": status_only})
