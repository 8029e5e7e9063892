"""sloppy: the careful plan, but each call's first draft has a wrong type, a missing field or an invented enum value;
after an `is_error` result it sends the corrected call once."""

from __future__ import annotations

from typing import Any

from ..transcript import Transcript
from . import careful
from ._common import Reply


def _draft(block: dict[str, Any]) -> dict[str, Any]:
    """The sloppy first attempt at a call."""
    name, good = block["name"], block["input"]
    if name == "list_orders":
        bad = {**good, "limit": "five"}  # wrong type
    elif name == "cancel_order":
        bad = {**good, "reason": "changed_my_mind"}  # invented enum value
    elif name == "search_help_center":
        bad = {"q": good.get("query", "")}  # required field missing (and an unknown one)
    elif name == "escalate_to_human":
        bad = {**good, "urgency": "urgent"}  # invented enum value
    elif name in ("lookup_order", "get_shipping_status") and isinstance(good.get("order_id"), str):
        bad = {**good, "order_id": good["order_id"].upper()}  # does not match ^ord_[0-9a-f]{8}$
    else:
        bad = good
    return {**block, "input": bad}


def _fixed(block: dict[str, Any]) -> dict[str, Any]:
    """The corrected call, written after reading the error."""
    if block["name"] == "list_orders":
        return {**block, "input": {**block["input"], "limit": 5}}
    return block


def decide(t: Transcript) -> Reply:
    last = t.last
    if last is not None and last.failed:
        intended = careful.decide(t.without_last())
        calls = [b for b in intended.content if b["type"] == "tool_use"]
        drafts = [_draft(b) for b in calls]
        sent = [{"name": c.name, "input": c.input} for c in last.calls]
        if calls and drafts != calls and [{"name": d["name"], "input": d["input"]} for d in drafts] == sent:
            return Reply([_fixed(b) for b in intended.content if b["type"] == "tool_use"])
    plan = careful.decide(t)
    return Reply([_draft(b) if b["type"] == "tool_use" else b for b in plan.content], plan.stop_reason)
