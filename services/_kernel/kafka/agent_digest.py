"""A turn started under another agent is said, never silent: a log line and a span attribute.

Each service's shell holds the digest of the agent it runs; `check()` compares it with the digest the guard
stamped on the turn (a rolling upgrade, or two agents on one fleet by mistake), once per turn in the log.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace

from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.kafka.dedupe import SeenIds

log = logging.getLogger("roundtrip.agent")


class Digest:
    """The digest of the agent a service runs, compared with the digest of each turn it handles."""

    def __init__(self, service: str, digest: str) -> None:
        self.service, self.digest = service, digest
        self._said = SeenIds(SYSTEM, capacity=10_000)  # turns already reported

    def check(self, message: Any, span: trace.Span | None = None) -> bool:
        """True when `message` belongs to a turn started under another digest than this one (and says so)."""
        turn: Any = getattr(message, "turn", None)
        theirs, ours = getattr(turn, "agent_digest", ""), self.digest
        span = span or trace.get_current_span()
        if version := getattr(turn, "agent_version", ""):  # every span of a turn names the version it runs on
            span.set_attribute("roundtrip.agent.version", version)
        if not theirs or not ours or theirs == ours:
            return False
        span.set_attribute("roundtrip.agent.digest_mismatch", theirs)
        span.set_attribute("roundtrip.agent.digest", ours)
        if self._said.add(turn.turn_id):
            log.warning(
                "turn %s was started under agent digest %s; this %s runs agent digest %s (a rolling upgrade in "
                "progress, or two versions of the agent on one fleet)",
                turn.turn_id,
                theirs,
                self.service,
                ours,
            )
        return True
