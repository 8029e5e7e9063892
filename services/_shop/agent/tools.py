"""The support agent's tools: async handlers, authorization policies, the approval rule and the resolver
(docs/agent/tools.md says what each gets and returns); their binding to tool names is the agent, in __init__.py.

A handler always acts for `ctx.customer_id`, never for a customer named in the input: the model's input can name
anyone, the principal cannot be chosen by the model.
"""

from __future__ import annotations

import json
from typing import Any, cast

from roundtrip import ToolContext, ToolError, approval_rule
from roundtrip._shop.agent.client import IdempotencyConflict, OrderNotCancellable, OrderNotFound
from roundtrip._shop.agent.settings import ShopAgentSettings

CANCELLABLE = ("pending", "processing")


def not_found_message(order_id: str) -> str:
    return (
        f"No order {order_id} was found for this customer. Do not guess order ids: call list_orders "
        "to see the customer's orders, or ask the customer for the exact order id."
    )


def not_cancellable_message(order_id: str, status: str) -> str:
    if status == "cancelled":
        return f"Order {order_id} is already cancelled; there is nothing left to cancel. Tell the customer."
    hint = (
        "Offer a return once it has been delivered, or escalate_to_human if the customer needs it stopped."
        if status == "shipped"
        else "Offer a return instead (delivered items can be returned within 30 days)."
    )
    return (
        f"Order {order_id} is {status} and can no longer be cancelled; only pending or processing orders can be. {hint}"
    )


def _money(cents: int, currency: str) -> str:
    return f"{cents / 100:.2f} {currency}"


def _summary(order: dict[str, Any]) -> dict[str, Any]:
    return {
        "order_id": order["order_id"],
        "status": order["status"],
        "placed_at": order["placed_at"],
        "total": _money(order["total_cents"], order["currency"]),
        "total_cents": order["total_cents"],
        "currency": order["currency"],
        "items": [f"{i['quantity']} x {i['name']}" for i in order["items"]],
    }


def _detail(order: dict[str, Any]) -> dict[str, Any]:
    detail = {k: v for k, v in order.items() if k != "customer_id"}
    detail["total"] = _money(order["total_cents"], order["currency"])
    detail["cancellable"] = order["status"] in CANCELLABLE
    return detail


async def list_orders(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    orders = await ctx.deps.shop.list_orders(ctx.customer_id, status=args.get("status"), limit=args.get("limit"))
    return {"orders": [_summary(o) for o in orders], "count": len(orders)}


async def lookup_order(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    order = await ctx.deps.shop.get_order(ctx.customer_id, args["order_id"])
    if order is None:
        raise ToolError(not_found_message(args["order_id"]))
    return _detail(order)


async def cancel_order(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    order_id = args["order_id"]
    try:
        order = await ctx.deps.shop.cancel_order(ctx.customer_id, order_id, args["reason"], ctx.idempotency_key)
    except OrderNotFound:
        raise ToolError(not_found_message(order_id)) from None
    except OrderNotCancellable as exc:
        raise ToolError(not_cancellable_message(order_id, exc.status)) from None
    except IdempotencyConflict:
        raise ToolError(
            f"This cancellation request conflicts with an earlier one for a different order; order {order_id} "
            "was not cancelled. Look the order up again before retrying."
        ) from None
    return {
        "cancelled": True,
        "order": _detail(order),
        "refund": "Full refund to the original payment method within 5 to 10 business days.",
    }


async def get_shipping_status(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    info: dict[str, Any] | None = await ctx.deps.shop.shipping_status(ctx.customer_id, args["order_id"])
    if info is None:
        raise ToolError(not_found_message(args["order_id"]))
    if info["status"] in ("pending", "processing"):
        info = info | {"note": "Not shipped yet: no carrier or tracking number until it ships."}
    elif info["status"] == "cancelled":
        info = info | {"note": "This order was cancelled and will not ship."}
    return info


async def search_help_center(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    articles = await ctx.deps.shop.search_help(ctx.customer_id, args["query"])
    return {"articles": articles, "count": len(articles)}


async def escalate_to_human(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    try:
        ticket: dict[str, Any] = await ctx.deps.shop.escalate(
            ctx.customer_id, args["summary"], args["urgency"], ctx.idempotency_key
        )
    except IdempotencyConflict:
        raise ToolError("This escalation conflicts with an earlier request; no new ticket was opened.") from None
    return ticket | {"message": "A human agent will contact the customer; share the ticket id with them."}


async def cancel_order_policy(
    args: dict[str, Any], entities: dict[str, dict[str, Any]], ctx: ToolContext
) -> str | None:
    order = entities.get("order_id")
    order_id = args.get("order_id", "?")
    if order is None:
        return not_found_message(order_id)
    if order.get("customer_id") not in (None, ctx.customer_id):  # defence in depth: the resolver already scopes
        return not_found_message(order_id)
    if order.get("status") not in CANCELLABLE:
        return not_cancellable_message(order_id, str(order.get("status")))
    return None


@approval_rule(can_hold=lambda settings: settings.approval_cancel_above_cents is not None)
def cancel_order_approval(
    args: dict[str, Any], entities: dict[str, dict[str, Any]], settings: ShopAgentSettings
) -> str | None:
    limit = settings.approval_cancel_above_cents
    if limit is None:
        return None
    order = entities.get("order_id") or {}
    total = order.get("total_cents")
    if not isinstance(total, int) or total <= limit:
        return None
    currency = str(order.get("currency", ""))
    return (
        f"cancelling order {order.get('order_id', args.get('order_id'))} of {_money(total, currency)} refunds more "
        "than "
        f"{_money(limit, currency)}, which needs a person's approval"
    )


async def resolve_order(order_id: str, ctx: ToolContext) -> dict[str, Any] | None:
    return cast("dict[str, Any] | None", await ctx.deps.shop.get_order(ctx.customer_id, order_id))


def describe_action(tool: str, args: dict[str, Any], result: str) -> str | None:
    """(tool, input, result text) of a successful cancel or escalation -> its words; None: the fleet's generic ones."""
    if tool == "cancel_order":
        return f"I cancelled order {args.get('order_id', '?')}"
    if tool == "escalate_to_human":
        try:
            ticket = json.loads(result).get("ticket_id")
        except (ValueError, AttributeError):
            ticket = None
        return (
            f"I passed your request to our support team (ticket {ticket})"
            if ticket
            else "I passed your request to our support team"
        )
    return None
