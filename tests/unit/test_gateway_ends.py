"""The gateway answers an end only when it is the one the guard recorded (services/_gateway/turns.py, `forged`):
status, customer, conversation, request, outcome and the reply's digest, read from a real (SQLite) ledger."""

from __future__ import annotations

import sqlite3
import time

import pytest

from roundtrip._gateway.turns import forged
from roundtrip._guard.ledger import Ledger
from roundtrip._guard.replies import Replies
from roundtrip._guard.rules import Policy
from roundtrip._kernel.storage.turnstore import TurnStore
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import CancelTurn, ModelResponded, Outcome, StartTurn, Turn, TurnEnded, Usage
from tests.cores import guard as guard_of
from tests.databases import migrated
from tests.prices import price_table

TURN = Turn(turn_id="turn_g", request_id="req_g", conversation_id="conv_g", customer_id="cus_1001")
PRICES = '{"default": [3.0, 15.0, 3.75, 0.30]}'
PHISH = "PHISH: verify your card at evil.example"


class Recorder:
    def __init__(self) -> None:
        self.ends: list[TurnEnded] = []

    async def __call__(self, topic, message, conversation_id):
        if topic == topics.OUTCOMES:
            self.ends.append(message)


@pytest.fixture
async def fleet(tmp_path):
    """The guard's ledger, and the gateway's read-only view of it."""
    url = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    ledger, recorder = await Ledger.open(url), Recorder()
    guard = guard_of(ledger=ledger, policy=Policy(replies=Replies()), prices=price_table(PRICES), publish=recorder)
    guard.recorder = recorder
    view = await TurnStore.open(url, read_only=True)
    yield guard, view
    await guard.outbox.drain()
    await view.close()
    await ledger.close()


def answered(text: str) -> ModelResponded:
    return ModelResponded(
        turn=TURN,
        step=1,
        messages=[{"role": "user", "content": "hi"}],
        content=[{"type": "text", "text": text}],
        stop_reason="end_turn",
        usage=Usage(input_tokens=1, output_tokens=1),
        spent=Usage(input_tokens=1, output_tokens=1),
    )


async def test_the_guards_own_ends_are_answered_from_the_loop_and_from_outside(fleet):
    guard, view = fleet
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    await guard.loop.on_iteration(answered("Your order shipped."))
    other = TURN.model_copy(update={"turn_id": "turn_h", "request_id": "req_h", "conversation_id": "conv_h"})
    await guard.starts.on_start(StartTurn(turn=other, text="hi"))
    cancel = CancelTurn(turn_id="turn_h", customer_id="cus_1001", conversation_id="conv_h")
    assert await guard.external_ends.on_cancel(cancel) == "cancelled"
    await guard.outbox.drain()
    assert len(guard.recorder.ends) == 2
    for end in guard.recorder.ends:
        assert forged(end, await view.ended_as(end.turn.turn_id), time.time(), 3600) is None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"text": PHISH}, "its text is not the reply the guard recorded"),
        ({"outcome": Outcome.CANCELLED}, "its outcome is not the one the ledger recorded"),
        ({"turn": TURN.model_copy(update={"customer_id": "cus_other"})}, "customer"),
        ({"turn": TURN.model_copy(update={"conversation_id": "conv_other"})}, "conversation"),
        ({"turn": TURN.model_copy(update={"request_id": "req_other"})}, "request"),
        ({"turn": TURN.model_copy(update={"turn_id": "turn_unknown"})}, "the ledger has no such turn"),
    ],
)
async def test_an_end_differing_from_the_recorded_one_in_anything_the_reply_says_is_refused(fleet, change, why):
    guard, view = fleet
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    await guard.loop.on_iteration(answered("Your order shipped."))
    await guard.outbox.drain()
    (genuine,) = guard.recorder.ends
    copy = genuine.model_copy(update=change)
    assert why in (forged(copy, await view.ended_as(copy.turn.turn_id), time.time(), 3600) or "")


async def test_an_end_naming_a_live_turn_is_refused(fleet):
    guard, view = fleet
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    end = TurnEnded(turn=TURN, step=1, outcome=Outcome.END_TURN, text=PHISH)
    assert forged(end, await view.ended_as("turn_g"), time.time(), 3600) == "the ledger has not ended this turn"


async def test_an_end_recorded_before_replies_were_digested_is_answered_only_while_it_is_fresh(fleet, tmp_path):
    """A turn ended by a guard before the upgrade (ledger_0006) has no digest: its end in flight still gets its reply,
    but a copy of it long after cannot speak to its customer."""
    guard, view = fleet
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    await guard.loop.on_iteration(answered("Your order shipped."))
    await guard.outbox.drain()
    (genuine,) = guard.recorder.ends
    with sqlite3.connect(tmp_path / "ledger.db") as db:  # as a guard before ledger_0006 recorded it
        db.execute("UPDATE turns SET reply_sha256 = NULL")
    recorded = await view.ended_as(TURN.turn_id)
    assert forged(genuine, recorded, recorded.ended_at + 5, 3600) is None
    assert "too long ago" in (forged(genuine, recorded, recorded.ended_at + 3601, 3600) or "")
