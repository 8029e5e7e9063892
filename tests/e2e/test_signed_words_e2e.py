"""The approver sees only signed words (issue 51): the fleet as processes over the real broker.

Alice asks to cancel her 87.00 EUR order; the gate holds it for a person, who approves it. Right after the guard has
applied that approval (the turn runs again at the held step), a plain Kafka producer publishes edited copies of the
genuine ApprovalRequested: under a new approval id with other words ("refund 3.00 EUR") and the turn's deadline in
the year 2100, and under the genuine id with other words. The guard records neither: both are dead-lettered with the
reason, the console's inbox and the ledger show nothing new, and the turn keeps the deadline the guard gave it.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from roundtrip._console.ledger_reader import Books
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome
from tests.e2e.test_approvals_e2e import ORDER, _reset_shop, _status, _told_waiting, approvals_on  # noqa: F401
from tests.e2e.test_guard_e2e import roundtrip_cli

ALICE = "cus_1001"
YEAR_2100 = 4102444800.0
WORDS = "refund 3.00 EUR"


def _edited(genuine: dict, **fields) -> dict:
    """The genuine request as an attacker rewrites it: other words everywhere the approver reads them."""
    messages = [*genuine["messages"][:-1], {"role": "user", "content": WORDS}, genuine["messages"][-1]]
    entities = {field: {**entity, "total_cents": 300} for field, entity in genuine["entities"].items()}
    return {**genuine, "reason": WORDS, "entities": entities, "messages": messages, **fields}


async def test_an_edited_copy_of_an_approval_request_shows_nothing_new_and_moves_no_deadline(
    approvals_on,  # noqa: F811 - the fixture imported above
    client,
    fleet_settings,
    shop_orders,
):
    settings = fleet_settings[0]
    _reset_shop(settings)
    conversation = f"conv_{uuid.uuid4().hex[:10]}"
    request_id = await client.ask(
        "cancel my last order", customer=ALICE, persona="careful", conversation_id=conversation
    )
    await _told_waiting(client, request_id)
    (genuine,) = client.of_turn(topics.APPROVAL_REQUESTS, request_id)
    turn_id, approval_id = genuine["turn"]["turn_id"], genuine["approval_id"]
    assert "87.00 EUR" in genuine["reason"] and genuine["entities"]["order_id"]["total_cents"] == 8700

    approved = await asyncio.to_thread(
        roundtrip_cli, fleet_settings, "approvals", "approve", approval_id, "--by", "alice@support"
    )
    assert approved.returncode == 0, approved.stderr
    # the guard applied the approval: the held call goes back to the gate with it, under the turn's extended deadline
    (resumed,) = await client.wait_for(
        lambda: [c for c in client.of_turn(topics.TOOL_CALLS, request_id) if c.get("decisions")], timeout=60
    )
    deadline = resumed["turn"]["deadline_at"]
    assert genuine["turn"]["deadline_at"] <= deadline < genuine["turn"]["deadline_at"] + 120

    new_id = "appr_" + uuid.uuid4().hex[:20]
    copies = {
        "new id, other words, 2100": _edited(
            genuine, approval_id=new_id, turn={**genuine["turn"], "deadline_at": YEAR_2100}
        ),
        "same id, other words": _edited(genuine),
    }
    for name, copy in copies.items():
        await client.producer.send_and_wait(
            client.topic(topics.APPROVAL_REQUESTS), json.dumps(copy).encode(), key=f"{conversation}:{name}".encode()
        )

    def letters() -> dict[str, dict] | None:
        found = {
            letter["key"].split(":", 1)[1]: letter
            for letter in client.seen[topics.DEAD_LETTERS]
            if (letter.get("key") or "").startswith(f"{conversation}:")
        }
        return found if set(copies) <= set(found) else None

    found = await client.wait_for(letters, timeout=60)
    for name in copies:
        letter = found[name]
        assert (letter["service"], letter["topic"]) == ("guard", client.topic(topics.APPROVAL_REQUESTS)), letter
        assert "signature mismatch" in letter["reason"] and "edited" in letter["reason"], letter["reason"]

    reply = await client.reply(request_id, timeout=60)
    assert reply.outcome is Outcome.END_TURN and f"cancelled order {ORDER}" in reply.text
    await client.settled()  # every record handled: a second wait or reply would be on its topic by now
    assert len(client.replies[request_id]) == 1 and _status(shop_orders, ORDER) == "cancelled"
    waits = [s for s in client.seen[topics.SUPPORT_STATUS] if s["request_id"] == request_id and s.get("approval_id")]
    assert {s["approval_id"] for s in waits} == {approval_id}  # the app was never told of a second wait

    books = Books(settings.ledger_db_url, None)  # what the console reads
    try:
        assert not [r for r in await books.waiting() if r.turn_id == turn_id]
        assert await books.approval(new_id) == (None, None)
        row, approvals = await books.turn(turn_id)
        assert [(a.approval_id, a.status, a.reason, a.decided_by) for a in approvals] == [
            (approval_id, "approved", genuine["reason"], "alice@support")
        ]
        assert WORDS not in approvals[0].request_json
        assert row is not None and row.deadline_at == pytest.approx(deadline, abs=0.001)
    finally:
        await books.close()
    listed = await asyncio.to_thread(roundtrip_cli, fleet_settings, "approvals", "--all")
    assert approval_id in listed.stdout and new_id not in listed.stdout and WORDS not in listed.stdout, listed.stdout
