"""A turn started under another agent is said, never silent: a log line and a span attribute.

The guard stamps every turn it starts with its agent's digest (`Turn.agent_digest`: Agent.digest, a hash of the
system prompt and the tools). Each service process says which digest it runs (`running()`, once at start); every
message of a turn it consumes is compared (`check()`, from the consumer path). When they differ, during a rolling
upgrade or with two agents on one fleet by mistake, the message's span gets `roundtrip.agent.digest_mismatch` (the
turn's digest; `roundtrip.agent.digest` is this process's) and the log says so once per turn in this process.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace

from roundtrip._kernel.kafka.dedupe import SeenIds

log = logging.getLogger("roundtrip.agent")
_running: dict[str, str] = {}  # "service", "digest": what this process runs
_said = SeenIds(capacity=10_000)  # turns already reported by this process


def running(service: str, digest: str) -> None:
    """This process runs the agent of this digest (the five services call it once, at start)."""
    _running.update(service=service, digest=digest)


def check(message: Any, span: trace.Span | None = None) -> bool:
    """True when `message` belongs to a turn started under another agent digest than this process runs (and says so)."""
    turn: Any = getattr(message, "turn", None)
    theirs, ours = getattr(turn, "agent_digest", ""), _running.get("digest", "")
    if not theirs or not ours or theirs == ours:
        return False
    span = span or trace.get_current_span()
    span.set_attribute("roundtrip.agent.digest_mismatch", theirs)
    span.set_attribute("roundtrip.agent.digest", ours)
    if _said.add(turn.turn_id):
        log.warning(
            "turn %s was started under agent digest %s; this %s runs agent digest %s (a rolling upgrade in "
            "progress, or two versions of the agent on one fleet)",
            turn.turn_id,
            theirs,
            _running["service"],
            ours,
        )
    return True
