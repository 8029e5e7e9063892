"""Topic names: the first four are the public contract, the rest internal. Who reads and writes each: topology.py."""

from __future__ import annotations

SUPPORT_REQUESTS = "support.requests"
SUPPORT_REPLIES = "support.replies"
SUPPORT_STATUS = "support.status"
SUPPORT_STREAM = "support.stream"
TURN_STARTS = "turn.starts"
TURN_CONTROLS = "turn.controls"
MODEL_CALLS = "turn.model_calls"
ITERATIONS = "turn.iterations"
TOOL_CALLS = "turn.tool_calls"
TOOL_BATCHES = "turn.tool_batches"
OUTCOMES = "turn.outcomes"
TURN_EVENTS = "turn.events"
DEAD_LETTERS = "roundtrip.dead_letters"
DEAD_LETTERS_HANDLED = "roundtrip.dead_letters.handled"
APPROVAL_REQUESTS = "turn.approval_requests"
APPROVAL_DECISIONS = "turn.approval_decisions"


def t(name: str, prefix: str) -> str:
    """The topic's name on the wire under ROUNDTRIP_TOPIC_PREFIX `prefix`."""
    return prefix + name
