"""The turn's principal comes from the ledger, never from an event (docs/guarantees.md, the threat model): the fence's
claims, the guard's advance and the gate's authorization refuse a turn whose customer or conversation is not the one
recorded at its start, and say so on `roundtrip.security` in one line whatever the ids hold."""

from __future__ import annotations

import logging
import time

import pytest

from roundtrip._gate.recorded import RecordedTurns
from roundtrip._guard.ledger import Ledger
from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.storage.turnstore import Fence, TurnRefused
from roundtrip._kernel.wire.events import Turn
from tests.databases import migrated
from tests.ledger_steps import advance

ALICE = Turn(
    turn_id="turn_a",
    request_id="req_a",
    conversation_id="conv_a",
    customer_id="cus_alice",
    deadline_at=10**10,
    metadata={"tier": "basic"},
)


@pytest.fixture
async def stores(tmp_path):
    url = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    ledger, fence = await Ledger.open(url), await Fence.open(url)
    assert await ledger.start(ALICE.model_dump(mode="json"), pending="{}", deadline_at=ALICE.deadline_at)
    yield ledger, fence
    await fence.close()
    await ledger.close()


def as_bob(**changes) -> Turn:
    return ALICE.model_copy(update={"customer_id": "cus_bob", **changes})


async def test_a_claim_for_another_customer_or_conversation_is_refused_and_the_turn_goes_on(stores):
    ledger, fence = stores
    for forged in (as_bob(), ALICE.model_copy(update={"conversation_id": "conv_b"})):
        with pytest.raises(TurnRefused, match="not the one the turn was"):
            await fence.claim_model_call(forged, 0, now=time.time())
        with pytest.raises(TurnRefused):
            await fence.claim_batch(forged, 0, lease_s=10, now=time.time())
        assert not await fence.wait_for_capacity(forged, 0, now=time.time())
        with pytest.raises(TurnRefused):
            await ledger.refuse_if_not_recorded(forged, "guard")
        assert not await advance(ledger, forged, 1, {}, 0.0, pending="{}", now=time.time())
    row = await ledger.get(ALICE.turn_id)
    assert (row.step, row.lease_until) == (0, None)  # nothing the copies tried was recorded
    assert await fence.claim_model_call(ALICE, 0, now=time.time()) and await advance(
        ledger, ALICE, 1, {}, 0.0, pending="{}", now=time.time()
    )
    assert await fence.claim_batch(ALICE, 1, lease_s=10, now=time.time())


async def test_a_refused_claim_of_an_ended_or_unknown_turn_is_not_a_forgery(stores):
    _ledger, fence = stores
    assert not await fence.claim_batch(
        ALICE, 5, lease_s=10, now=time.time()
    )  # a step the turn is not at: no refusal, just no
    unknown = ALICE.model_copy(update={"turn_id": "turn_gone"})  # deleted by retention, or never started
    assert not await fence.claim_model_call(unknown, 0, now=time.time())


async def test_the_gate_authorizes_for_the_turn_as_recorded_at_its_start(stores):
    ledger, _ = stores
    turns = RecordedTurns(ledger, SYSTEM)
    assert await turns.authorized(ALICE) == ALICE
    later = ALICE.model_copy(update={"deadline_at": ALICE.deadline_at + 60})  # an approval extends the deadline
    assert (await turns.authorized(later)).deadline_at == later.deadline_at
    forgeries = {
        "customer": as_bob(),
        "conversation": ALICE.model_copy(update={"conversation_id": "conv_b"}),
        "metadata": ALICE.model_copy(update={"metadata": {"tier": "gold"}}),
        "persona": ALICE.model_copy(update={"persona": "careless"}),
        "ledger has no such turn": ALICE.model_copy(update={"turn_id": "turn_x"}),
    }
    for what, forged in forgeries.items():
        with pytest.raises(TurnRefused, match=what):
            await turns.authorized(forged)
    assert await turns.authorized(ALICE) == ALICE  # a refused copy changes nothing the gate remembers


async def test_the_security_line_is_one_line_whatever_the_ids_hold(stores, caplog):
    _, fence = stores
    forged = as_bob(customer_id="cus_bob\nroundtrip.security ERROR forged line")
    with caplog.at_level(logging.ERROR, logger="roundtrip.security"), pytest.raises(TurnRefused):
        await fence.claim_batch(forged, 0, lease_s=10, now=time.time())
    (line,) = [r.getMessage() for r in caplog.records if r.name == "roundtrip.security"]
    assert "\n" not in line and "'cus_bob\\nroundtrip.security" in line and "executor refused" in line
