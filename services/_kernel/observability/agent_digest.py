"""A turn started under another agent is said, never silent: a log line and a span attribute.

Each process says the digest of the agent it runs (`running()`, at start); `check()` compares it with the digest
the guard stamped on the turn (a rolling upgrade, or two agents on one fleet by mistake), once per turn in the log.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace

from roundtrip._kernel.kafka.dedupe import SeenIds

log = logging.getLogger("roundtrip.agent")
_running: dict[str, str] = {}
_said = SeenIds(capacity=10_000)  # turns already reported


def running(service: str, digest: str) -> None:
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
