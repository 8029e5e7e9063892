"""The in-memory ports the in-process loop builds the services' cores with: what the fleet's ledger and broker give
them there, for one process running one turn at a time."""

from __future__ import annotations

from roundtrip._kernel.storage.turnstore import Principal
from roundtrip._kernel.wire.events import Turn


class OpenFence:
    """The turn fence of a loop that is the only one running its turn: every claim succeeds; the side effects a
    step recorded are kept in `acted` (the ledger keeps them for an end from outside the loop)."""

    def __init__(self) -> None:
        self.acted: list[tuple[str, int, str]] = []

    async def claim_model_call(self, turn: Principal, step: int, now: float) -> bool:
        return True

    async def wait_for_capacity(self, turn: Principal, step: int, now: float) -> bool:
        return True

    async def claim_batch(self, turn: Principal, step: int, lease_s: float, now: float) -> bool:
        return True

    async def record_acted(self, turn_id: str, step: int, lines: str) -> None:
        self.acted.append((turn_id, step, lines))


class StartedTurns:
    """The turns as the loop started them: the in-process loop is the only writer of its turns' events."""

    async def authorized(self, turn: Turn) -> Turn:
        return turn
