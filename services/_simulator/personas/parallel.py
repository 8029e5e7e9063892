"""parallel: asks for several independent tool calls in one response.

cancel:     [list_orders {}, search_help_center {"cancellation policy"}] -> cancel_order -> confirmation
track/list: list_orders {} -> [get_shipping_status x up to 3 most recent orders] -> summary
help:       [search_help_center {the customer's words}, search_help_center {a related query}] -> titles
human:      [escalate_to_human, search_help_center {"contact support"}] -> confirmation
"""

from __future__ import annotations

from ..transcript import Transcript
from ._common import (
    CANCEL_REASON,
    CANCELLABLE,
    Reply,
    act,
    answer,
    articles,
    call,
    cancelled,
    capitalize,
    escalated,
    newest,
    nothing_to_cancel,
    order_list,
    orders_in,
    shipping,
    sorry,
)


def decide(t: Transcript) -> Reply:
    return {"cancel": cancel, "track": status, "list": status, "help": help_, "human": human}[t.intent](t)


def cancel(t: Transcript) -> Reply:
    last = t.last
    if last is None:
        return act(
            call("list_orders"),
            call("search_help_center", {"query": "cancellation policy"}),
            preface="Let me pull up your orders and our cancellation policy at the same time.",
        )
    if listed := last.get("list_orders"):
        if listed.is_error:
            return answer(sorry(last))
        order = newest(orders_in(listed), CANCELLABLE)
        if order is None:
            return answer(nothing_to_cancel(orders_in(listed)))
        return act(call("cancel_order", {"order_id": order["order_id"], "reason": CANCEL_REASON}))
    if done := last.get("cancel_order"):
        return answer(sorry(last) if done.is_error else cancelled(done))
    return answer(sorry(last) if last.failed else "I've looked into this. Is there anything else I can help with?")


def status(t: Transcript) -> Reply:
    last = t.last
    if last is None:
        return act(call("list_orders"))
    if listed := last.get("list_orders"):
        if listed.is_error:
            return answer(sorry(last))
        orders = orders_in(listed)[:3]
        if not orders:
            return answer(order_list([]))
        return act(
            *(call("get_shipping_status", {"order_id": o["order_id"]}) for o in orders),
            preface=f"I'll check the shipping status of your {len(orders)} most recent orders at once.",
        )
    return answer(" ".join(capitalize(shipping(r)) for r in last.results) + " Anything else I can help with?")


def help_(t: Transcript) -> Reply:
    last = t.last
    if last is None:
        query = t.request.strip()[:200]
        related = "refund policy" if "refund" not in query.lower() else "return policy"
        return act(call("search_help_center", {"query": query}), call("search_help_center", {"query": related}))
    if all(r.is_error for r in last.results):
        return answer(sorry(last))
    return answer(articles(list(last.results)))


def human(t: Transcript) -> Reply:
    last = t.last
    if last is None:
        summary = f"Customer asked to speak to a person: {t.request.strip()[:300]}"
        return act(
            call("escalate_to_human", {"summary": summary, "urgency": "normal"}),
            call("search_help_center", {"query": "contact support"}),
        )
    escalation = last.get("escalate_to_human")
    if escalation is None or escalation.is_error:
        return answer(sorry(last))
    return answer(escalated(escalation))
