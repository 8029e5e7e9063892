"""Personas whose tool input no event could carry, which the fleet's size policy must refuse.

bloated: search_help_center with a query of about 600 kB (needs a large max_tokens, as a real
         model would: ROUNDTRIP_MAX_TOKENS=200000)
deep:    lookup_order with an order_id nested 600 lists deep
After an error result they apologise and end the turn (stop_reason end_turn).
"""

from __future__ import annotations

from typing import Any

from ..transcript import Transcript
from ._common import Reply, act, answer, call

BLOATED_BYTES = 600 * 1024
DEPTH = 600

SORRY = "I'm sorry, I couldn't look that up just now. Could you tell me a little more about what you need?"


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def bloated(t: Transcript) -> Reply:
    if t.last is None:
        return act(call("search_help_center", {"query": "refund " * (BLOATED_BYTES // 7)}))
    return answer(SORRY)


def deep(t: Transcript) -> Reply:
    if t.last is None:
        return act(call("lookup_order", {"order_id": _nested(DEPTH)}))
    return answer(SORRY)
