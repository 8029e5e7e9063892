"""careful: looks every id up before acting, one call per step, stops at the first error.

cancel: list_orders -> cancel_order {newest pending/processing order} -> "I've cancelled order ord_...".
A follow-up ("cancel the second one you listed") cancels the N-th order the assistant listed at once, when an
earlier list_orders result showed those ids.
"""

from __future__ import annotations

import re
from typing import cast

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


ORDINALS = {
    "first": 1,
    "1st": 1,
    "second": 2,
    "2nd": 2,
    "third": 3,
    "3rd": 3,
    "fourth": 4,
    "4th": 4,
    "fifth": 5,
    "5th": 5,
}
ORDINAL = re.compile(r"\b(" + "|".join(ORDINALS) + r")\b")
ORDER_ID = re.compile(r"\bord_[0-9a-z]+\b")


def listed_before(t: Transcript) -> str | None:
    """The order the customer points at ("the second one you listed"): the N-th order id in the assistant's last
    words, if an earlier list_orders result showed it."""
    wanted = ORDINAL.search(t.request.lower())
    if wanted is None or not t.said_before:
        return None
    listed = list(dict.fromkeys(ORDER_ID.findall(t.said_before)))
    looked_up = {
        o["order_id"] for step in t.earlier for r in step.results if r.name == "list_orders" for o in orders_in(r)
    }
    position = ORDINALS[wanted.group(1)]
    if position > len(listed) or listed[position - 1] not in looked_up:
        return None
    return cast(str, listed[position - 1])


def cancel(t: Transcript) -> Reply:
    last = t.last
    if last is None:
        if (order_id := listed_before(t)) is not None:
            return act(call("cancel_order", {"order_id": order_id, "reason": CANCEL_REASON}))
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
