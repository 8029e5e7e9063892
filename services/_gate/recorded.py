"""The turn the gate authorizes for: the one the ledger recorded at its start, never the one an event carries.

Every internal topic can be written by more than the service that should (a compromised service, a producer on an
unsecured listener), so a command whose turn differs from its start's record is refused and nothing is signed for it.
The record never changes but for its deadline, so each gate replica reads a turn once and keeps it.
"""

from __future__ import annotations

from roundtrip._kernel.clock import Clock
from roundtrip._kernel.kafka.dedupe import SeenIds
from roundtrip._kernel.storage.turnstore import NO_SUCH_TURN, TurnStore, disagreement, refused
from roundtrip._kernel.wire.events import Turn

REMEMBERED = 20_000  # turns a replica keeps at most
# a turn unasked-for this long is read again when its next step comes: memory follows the rate of running turns, not
# every turn of the last hours
IDLE_S = 120.0


class RecordedTurns:
    def __init__(self, store: TurnStore, clock: Clock) -> None:
        self.store = store
        self._turns = SeenIds(clock, REMEMBERED, max_age_s=IDLE_S)

    async def authorized(self, turn: Turn) -> Turn:
        """`turn` as the ledger recorded it; TurnRefused when the event's copy differs from that record."""
        recorded: Turn | None = self._turns.get(turn.turn_id)
        if recorded is None:
            row = await self.store.recorded(turn.turn_id)
            if row is None:
                raise refused(turn, "gate", NO_SUCH_TURN)  # the gate signs: an unknown turn gets nothing
            recorded = Turn.model_validate_json(row.turn_json)
            self._turns.first(turn.turn_id, recorded)
        # the principal first, in its own words; then any other field the copy changed
        if (why := disagreement(turn, recorded)) is not None:
            raise refused(turn, "gate", why)
        if changed := changed_fields(turn, recorded):
            raise refused(turn, "gate", f"its {', '.join(changed)} differ from the turn's start")
        # an approval extends the deadline; the executor's fence checks the ledger's own
        return recorded.model_copy(update={"deadline_at": turn.deadline_at})


def changed_fields(turn: Turn, recorded: Turn) -> list[str]:
    """The fields of `turn` that are not as recorded at its start, its deadline aside."""
    return [
        name for name in Turn.model_fields if name != "deadline_at" and getattr(turn, name) != getattr(recorded, name)
    ]
