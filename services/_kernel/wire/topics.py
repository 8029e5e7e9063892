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
# a fleet's own dead letters are per service (`dead_letters`); the shared topic of older fleets is only read
DEAD_LETTERS = "roundtrip.dead_letters"
DEAD_LETTERS_HANDLED = "roundtrip.dead_letters.handled"
DEAD_LETTERS_BY = DEAD_LETTERS + ".by."
APPROVAL_REQUESTS = "turn.approval_requests"
APPROVAL_DECISIONS = "turn.approval_decisions"
# an agent version's own copy of a topic: `turn.model_calls.version.v2` (topology.of_version)
VERSION_MARK = ".version."
VERSION_NAME = r"^[A-Za-z0-9_-]{1,40}$"  # no dot: a versioned topic names its version after the one mark
# the default version ("" on the wire) as the operator types it, and as metrics' labels and spans name it
DEFAULT_VERSION_WORD = "default"


def dead_letters(service: str) -> str:
    """The dead letters of `service`: it alone may write them, so a letter says which service refused its record."""
    return DEAD_LETTERS_BY + service


def dead_letters_service(name: str) -> str | None:
    """The service whose dead letters topic `name` (logical) holds; None for any other topic, the shared one too."""
    return name[len(DEAD_LETTERS_BY) :] if name.startswith(DEAD_LETTERS_BY) else None


def t(name: str, prefix: str) -> str:
    """The topic's name on the wire under ROUNDTRIP_TOPIC_PREFIX `prefix`."""
    return prefix + name
