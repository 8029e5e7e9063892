"""What every persona uses: the `Reply` it returns, and how it reads tool results and talks.

Tool results arrive as JSON text (or an error sentence when `is_error`). The readers here
are forgiving about shapes (`{"orders": [...]}` or a bare list, `articles` or `results`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from ..transcript import Result, Step

CANCELLABLE = ("pending", "processing")
ON_THE_WAY = ("shipped", "processing", "in_transit", "out_for_delivery")
CANCEL_REASON = "customer_request"


@dataclass(frozen=True)
class Reply:
    """Content blocks without ids (the engine assigns them); stop_reason None means 'infer'."""

    content: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None
    stop_sequence: str | None = None


def call(name: str, input: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": dict(input or {})}


def act(*calls: dict[str, Any], preface: str | None = None) -> Reply:
    """Ask for one or more tool calls (stop_reason tool_use)."""
    content = [{"type": "text", "text": preface}] if preface else []
    return Reply(content + list(calls))


def answer(text: str) -> Reply:
    """Final words to the customer (stop_reason end_turn)."""
    return Reply([{"type": "text", "text": text}])


# -- reading results ---------------------------------------------------------------------


def orders_in(result: Result | None) -> list[dict[str, Any]]:
    """Orders of a list_orders result, newest first."""
    if result is None or result.is_error:
        return []
    data = result.data
    orders = data.get("orders") if isinstance(data, dict) else data
    orders = [o for o in orders or [] if isinstance(o, dict) and isinstance(o.get("order_id"), str)]
    if orders and all(isinstance(o.get("placed_at"), str) for o in orders):
        orders.sort(key=lambda o: o["placed_at"], reverse=True)
    return orders


def newest(orders: list[dict[str, Any]], statuses: tuple[str, ...]) -> dict[str, Any] | None:
    return next((o for o in orders if o.get("status") in statuses), None)


def titles_in(result: Result | None) -> list[str]:
    """Article titles of a search_help_center result."""
    if result is None or result.is_error or not isinstance(result.data, (dict, list)):
        return []
    data = result.data
    items = data if isinstance(data, list) else next((v for v in data.values() if isinstance(v, list)), [])
    return [str(item["title"]) for item in items if isinstance(item, dict) and item.get("title")]


def field_of(result: Result | None, *keys: str) -> Any:
    if result is None or not isinstance(result.data, dict):
        return None
    return next((result.data[k] for k in keys if result.data.get(k) not in (None, "")), None)


def error_text(result: Result) -> str:
    """The error sentence of a failed call, tidied for a customer."""
    text: Any = result.text
    if isinstance(result.data, dict):
        inner = result.data.get("error")
        text = inner.get("message", text) if isinstance(inner, dict) else result.data.get("message", inner or text)
    text = " ".join(str(text).split()) or "the request could not be completed"
    if len(text) > 200:
        text = text[:197] + "..."
    return cast(str, text.rstrip(".") + ".")


# -- talking -----------------------------------------------------------------------------

_DOING = {
    "list_orders": "look up your orders",
    "lookup_order": "look up order {order_id}",
    "cancel_order": "cancel order {order_id}",
    "get_shipping_status": "check the shipping status of order {order_id}",
    "search_help_center": "search our help center",
    "escalate_to_human": "pass your request to our support team",
}


def doing(result: Result) -> str:
    template = _DOING.get(result.name, "complete that request")
    return template.format(order_id=result.call.input.get("order_id", "you mentioned"))


def sorry(step: Step) -> str:
    """A polite apology for the failed call(s) of a step; no retry is promised."""
    failures = "; ".join(f"I wasn't able to {doing(r)}: {error_text(r)}" for r in step.errors())
    return (
        f"I'm sorry. {failures[0].upper()}{failures[1:]} "
        "Nothing else was changed on your account. If you'd like, I can connect you with a member of our support team."
    )


def describe_order(order: dict[str, Any]) -> str:
    details = [str(order["status"])] if order.get("status") else []
    if order.get("placed_at"):
        details.append(f"placed {order['placed_at']}")
    return f"{order['order_id']} ({', '.join(details)})" if details else order["order_id"]


def order_list(orders: list[dict[str, Any]]) -> str:
    if not orders:
        return "I couldn't find any orders on your account."
    lines = "; ".join(describe_order(o) for o in orders[:5])
    more = f" (and {len(orders) - 5} more)" if len(orders) > 5 else ""
    return f"Here are your most recent orders: {lines}{more}."


def nothing_to_cancel(orders: list[dict[str, Any]]) -> str:
    if not orders:
        return (
            "I couldn't find any orders on your account, so there is nothing to cancel. Is there anything else I "
            "can help with?"
        )
    return (
        "I'm sorry, none of your orders can be cancelled any more: only pending or processing orders can be. "
        f"Your orders: {'; '.join(describe_order(o) for o in orders[:5])}. "
        "If you'd like to send something back, I can help you start a return."
    )


def cancelled(result: Result) -> str:
    order_id = field_of(result, "order_id") or result.call.input.get("order_id")
    status = field_of(result, "status")
    state = f" Its status is now {status}." if status else ""
    return f"I've cancelled order {order_id} for you.{state} Is there anything else I can help you with?"


def shipping(result: Result) -> str:
    order_id = result.call.input.get("order_id")
    if result.is_error:
        return f"I couldn't get the shipping status of order {order_id}: {error_text(result)}"
    status = field_of(result, "status", "shipping_status", "state")
    carrier = field_of(result, "carrier")
    tracking = field_of(result, "tracking_number", "tracking_id")
    eta = field_of(result, "estimated_delivery", "eta", "expected_delivery", "delivery_date")
    parts = [f"order {order_id} is {status}" if status else f"here is the latest on order {order_id}"]
    if carrier:
        parts.append(f"with {carrier}")
    if tracking:
        parts.append(f"(tracking number {tracking})")
    if eta:
        parts.append(f"and should arrive by {eta}")
    return " ".join(parts) + "."


def articles(results: list[Result]) -> str:
    titles = [t for r in results for t in titles_in(r)]
    titles = list(dict.fromkeys(titles))[:5]
    if not titles:
        return (
            "I couldn't find a help center article that answers that. "
            "I can connect you with a member of our support team if you'd like."
        )
    listed = "; ".join(f'"{t}"' for t in titles)
    return f"These help center articles should answer your question: {listed}. Let me know if anything is unclear."


def escalated(result: Result) -> str:
    ticket = field_of(result, "ticket_id", "escalation_id", "case_id", "id")
    ref = f" Your reference is {ticket}." if ticket else ""
    return f"I've passed your request to a member of our support team; they will get back to you soon.{ref}"


def capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]
