"""The in-memory ports the in-process loop builds the services' cores with: what the fleet's ledger and broker give
them there, for one process running one turn at a time."""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka import TopicPartition

from roundtrip._kernel.storage.turnstore import ENDED, Principal, reply_digest
from roundtrip._kernel.wire.events import Turn, TurnEnded


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


@dataclass(frozen=True)
class _Recorded:
    status: str
    customer_id: str
    conversation_id: str
    request_id: str
    outcome: str
    reply_sha256: str
    ended_at: float


class RecordedEnds:
    """The ends the guard's rules decided, as the ledger records them: the gateway's core checks each reply against
    its record as the fleet's does."""

    def __init__(self) -> None:
        self._ends: dict[str, _Recorded] = {}

    def record(self, ended: TurnEnded, now: float) -> None:
        turn = ended.turn
        self._ends[turn.turn_id] = _Recorded(
            ENDED,
            turn.customer_id,
            turn.conversation_id,
            turn.request_id,
            ended.outcome.value,
            reply_digest(ended.text),
            now,
        )

    async def ended_as(self, turn_id: str) -> _Recorded | None:
        return self._ends.pop(turn_id, None)  # read once, at the turn's one reply: the loop keeps no turn after it


class Replied:
    """The turns answered: one reply each (in the fleet, support.replies and its transactions)."""

    def __init__(self) -> None:
        self._answered: set[str] = set()

    async def answered(self, turn_id: str) -> bool:
        return turn_id in self._answered

    async def claim(self, turn_id: str, tp: TopicPartition, offset: int) -> bool:
        if turn_id in self._answered:
            return False
        self._answered.add(turn_id)
        return True
