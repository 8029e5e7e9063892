"""Which agent version a turn runs on (docs/decisions/agent-versions.md): a new conversation's bucket, a hash of its id,
against the ramp's shares; the conversation store records it at the first turn and the later ones keep it, unless
the operator drains that version: then the turn starts where the ramp sends a new conversation."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from roundtrip._kernel.storage.versions import Shares

log = logging.getLogger("roundtrip.guard")

BUCKETS = 10_000  # a share is placed to a hundredth of a percent
REFRESH_S = 1.0  # a ramp the operator sets reaches new conversations within this


def assign(conversation_id: str, shares: Mapping[str, float]) -> str:
    """The version a new conversation starts on: named versions take their shares (percent) of the buckets in name
    order, the default version ("") the rest. A hash, not a draw: a start delivered twice is assigned alike."""
    bucket = int.from_bytes(hashlib.sha256(conversation_id.encode()).digest()[:8], "big") % BUCKETS
    edge = 0.0
    for version in sorted(shares):
        edge += shares[version] * BUCKETS / 100
        if bucket < edge:
            return version
    return ""


class Ramp:
    """The shares as the ledger holds them, read again once they are REFRESH_S old; a failed read keeps the last ones
    (none read yet: it raises, so no conversation is assigned before the ramp is known)."""

    def __init__(self, read: Callable[[], Awaitable[Shares]]) -> None:
        self._read = read
        self._state = Shares({}, frozenset())
        self._read_at, self._known = -REFRESH_S, False
        self._reading = asyncio.Lock()

    async def version(self, conversation_id: str, pinned: str | None) -> str:
        """The version of a turn of this conversation: the one it is `pinned` to (None: a new conversation, or no
        conversation store), unless that one drains; else the ramp's."""
        if time.monotonic() - self._read_at >= REFRESH_S:
            await self._refresh()
        if pinned is not None and pinned not in self._state.draining:
            return pinned
        return assign(conversation_id, self._state.shares)

    async def _refresh(self) -> None:
        async with self._reading:
            if time.monotonic() - self._read_at < REFRESH_S:  # another start read them while this one waited
                return
            try:
                self._state, self._known = await self._read(), True
            except Exception as exc:
                if not self._known:
                    raise
                log.warning("the agent versions' shares could not be read (%s); keeping the last ones", exc)
            self._read_at = time.monotonic()
