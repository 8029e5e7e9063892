"""Runaway personas: they never end a turn by themselves; the fleet's guard must stop them.

stubborn: the same failing call every step: lookup_order {"order_id": "ord_0000dead"}
looping:  two failing calls in turn (A, B, A, B): lookup_order, get_shipping_status of ord_0000dead
flailing: a different failing call every step: lookup_order ord_0000de01, ord_0000de02, ...
Whatever the tool results say (errors, success, "blocked as a repeat"), they go on.
"""

from __future__ import annotations

from ..transcript import Transcript
from ._common import Reply, act, call

DEAD_ID = "ord_0000dead"


def stubborn(t: Transcript) -> Reply:
    return act(call("lookup_order", {"order_id": DEAD_ID}))


def looping(t: Transcript) -> Reply:
    if len(t.steps) % 2 == 0:
        return act(call("lookup_order", {"order_id": DEAD_ID}))
    return act(call("get_shipping_status", {"order_id": DEAD_ID}))


def flailing(t: Transcript) -> Reply:
    return act(call("lookup_order", {"order_id": f"ord_{0xDE00 + len(t.steps) + 1:08x}"}))
