"""careful: looks every id up before acting, one call per step, stops at the first error.

cancel: list_orders {} -> cancel_order {newest pending/processing order, customer_request}
        -> "I've cancelled order ord_... ".   (three model calls on the happy path)
track:  list_orders {} -> get_shipping_status {newest shipped/processing order} -> summary
help:   search_help_center {query: the customer's words} -> article titles
human:  escalate_to_human {summary, urgency normal} -> confirmation
list:   list_orders {} -> summary
"""

from __future__ import annotations

from ..transcript import Transcript
from ._common import (
    CANCEL_REASON,
    CANCELLABLE,
    ON_THE_WAY,
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
    return {"cancel": cancel, "track": track, "help": help_, "human": human, "list": list_}[t.intent](t)


def cancel(t: Transcript) -> Reply:
    last = t.last
    if last is None:
        return act(call("list_orders"))
    if last.failed:
        return answer(sorry(last))
    if listed := last.get("list_orders"):
        order = newest(orders_in(listed), CANCELLABLE)
        if order is None:
            return answer(nothing_to_cancel(orders_in(listed)))
        return act(call("cancel_order", {"order_id": order["order_id"], "reason": CANCEL_REASON}))
    if done := last.get("cancel_order"):
        return answer(cancelled(done))
    return answer("I've looked into this, but I'm not sure what to do next. Could you tell me which order you mean?")


def track(t: Transcript) -> Reply:
    last = t.last
    if last is None:
        return act(call("list_orders"))
    if last.failed:
        return answer(sorry(last))
    if listed := last.get("list_orders"):
        order = newest(orders_in(listed), ON_THE_WAY)
        if order is None:
            return answer(f"None of your orders is on its way right now. {order_list(orders_in(listed))}")
        return act(call("get_shipping_status", {"order_id": order["order_id"]}))
    return answer(capitalize(" ".join(shipping(r) for r in last.results)) + " Anything else I can help with?")


def help_(t: Transcript) -> Reply:
    last = t.last
    if last is None:
        return act(call("search_help_center", {"query": t.request.strip()[:200]}))
    if last.failed:
        return answer(sorry(last))
    return answer(articles(list(last.results)))


def human(t: Transcript) -> Reply:
    last = t.last
    if last is None:
        summary = f"Customer asked to speak to a person: {t.request.strip()[:300]}"
        return act(call("escalate_to_human", {"summary": summary, "urgency": "normal"}))
    if last.failed:
        return answer(sorry(last))
    return answer(escalated(last.results[0]))


def list_(t: Transcript) -> Reply:
    last = t.last
    if last is None:
        return act(call("list_orders"))
    if last.failed:
        return answer(sorry(last))
    return answer(order_list(orders_in(last.get("list_orders"))) + " Is there anything you'd like me to do with them?")
