"""Topic names. The public contract is the first four; the rest are internal to the fleet.

Who reads and writes each is declared in services/_kernel/wire/topology.py (`topology.topic_names()` lists them all)."""

from __future__ import annotations

SUPPORT_REQUESTS = "support.requests"  # public: clients publish SupportRequest
SUPPORT_REPLIES = "support.replies"  # public: clients read SupportReply
SUPPORT_STATUS = "support.status"  # public: clients may read SupportStatus (each step, a turn waiting for a person)
SUPPORT_STREAM = "support.stream"  # public: clients may read StreamedText (the text of a turn that streams)
TURN_STARTS = "turn.starts"  # StartTurn: gateway -> guard
TURN_CONTROLS = "turn.controls"  # CancelTurn: operators -> guard
MODEL_CALLS = "turn.model_calls"  # CallModel: guard/executor -> model
ITERATIONS = "turn.iterations"  # ModelResponded: model -> guard
TOOL_CALLS = "turn.tool_calls"  # CheckToolCalls: guard -> gate
TOOL_BATCHES = "turn.tool_batches"  # ExecuteToolBatch (signed): gate -> executor
OUTCOMES = "turn.outcomes"  # TurnEnded: guard -> gateway
TURN_EVENTS = "turn.events"  # TurnFlagged (stuck turns): guard -> operators
DEAD_LETTERS = "roundtrip.dead_letters"  # DeadLettered: any service
DEAD_LETTERS_HANDLED = "roundtrip.dead_letters.handled"  # DeadLetterHandled: console -> console (all its replicas)
APPROVAL_REQUESTS = "turn.approval_requests"  # ApprovalRequested: executor -> guard and operators
APPROVAL_DECISIONS = "turn.approval_decisions"  # ApprovalDecided (signed): people, any Kafka client -> guard


def t(name: str, prefix: str) -> str:
    """The topic's name on the wire: `prefix` is the topic prefix of the settings the caller was built with
    (ROUNDTRIP_TOPIC_PREFIX); a service's wiring carries its own (`messaging.Wiring.topic`)."""
    return prefix + name
