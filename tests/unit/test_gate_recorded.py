"""The gate's memory of recorded turns: a turn in use is read from the ledger once; one idle past IDLE_S is forgotten
and read again, so a gate's memory follows the running turns, not every turn of the last hours."""

from __future__ import annotations

from types import SimpleNamespace

from roundtrip._gate import recorded
from roundtrip._gate.recorded import RecordedTurns
from roundtrip._kernel.wire.events import Turn
from tests.clocks import showing


class Ledger:
    """The turns' start records, each read counted."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    async def recorded(self, turn_id: str):
        self.reads.append(turn_id)
        turn = Turn(turn_id=turn_id, request_id="r", conversation_id="c", customer_id="cus_1")
        return SimpleNamespace(turn_json=turn.model_dump_json())


def turn(n: int) -> Turn:
    return Turn(turn_id=f"t{n}", request_id="r", conversation_id="c", customer_id="cus_1")


async def test_a_turn_in_use_is_read_once_and_an_idle_one_is_forgotten():
    now = [0.0]
    ledger = Ledger()
    turns = RecordedTurns(ledger, showing(now))
    for step in range(5):  # one turn's steps, seconds apart
        now[0] = step * 5.0
        assert (await turns.authorized(turn(1))).turn_id == "t1"
    assert ledger.reads == ["t1"]
    for n in range(2, 500):  # then many other turns over the next 10 minutes
        now[0] = 20.0 + n
        await turns.authorized(turn(n))
    assert len(turns._turns) <= recorded.IDLE_S + 2  # the last two minutes' turns, not all 500
    await turns.authorized(turn(1))  # long idle: read again
    assert ledger.reads.count("t1") == 2
