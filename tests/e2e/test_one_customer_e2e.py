"""One customer, proven at every hop: a producer that can write every internal topic cannot act for another customer.

The attacker copies the events of Alice's live turn (held for a person's approval of a cancellation above the
threshold, so it stays live while the copies arrive) and publishes them again with a plain Kafka producer: the
customer rewritten to Bob, the cancelled order rewritten to Bob's, a batch's or a hold's signature rewritten.
Each copy must be dead-lettered by the service it reached with a reason, no service may act for Bob (no batch
signed, no model called, no approval recorded, Bob's order untouched), and Alice's turn still ends with exactly
one reply.
"""

from __future__ import annotations

import asyncio
import json
import uuid

from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome
from tests.e2e.test_approvals_e2e import ORDER, _reset_shop, _told_waiting, approvals_on  # noqa: F401 - a fixture
from tests.e2e.test_guard_e2e import roundtrip_cli

ALICE, BOB = "cus_1001", "cus_1002"


def _rewritten(event: dict, customer: str | None = None, order: str | None = None, **fields) -> bytes:
    """A copy of `event` for another customer, another order (every mention of Alice's order), other fields."""
    text = json.dumps({**event, **fields})
    if order:
        text = text.replace(f'"{ORDER}"', f'"{order}"')
    copy = json.loads(text)
    if customer:
        copy["turn"]["customer_id"] = customer
    return json.dumps(copy).encode()


def _holding(events: list[dict]) -> dict:
    """The event of the turn that carries the held cancellation."""
    return next(e for e in events if ORDER in json.dumps(e) and "cancel_order" in json.dumps(e))


async def test_a_writer_to_every_internal_topic_cannot_act_for_another_customer(
    approvals_on,  # noqa: F811 - the fixture imported above
    client,
    fleet_settings,
    shop_orders,
):
    _reset_shop(fleet_settings[0])
    before = shop_orders()
    bobs = next(
        oid for oid, (owner, status) in sorted(before.items()) if owner == BOB and status in ("pending", "processing")
    )
    conversation = f"conv_{uuid.uuid4().hex[:10]}"
    request_id = await client.ask(
        "cancel my last order", customer=ALICE, persona="careful", conversation_id=conversation
    )
    await _told_waiting(client, request_id)  # the guard recorded the turn as awaiting a person: it is live and held
    (approval,) = client.of_turn(topics.APPROVAL_REQUESTS, request_id)
    turn_id = approval["turn"]["turn_id"]
    model_call = max(client.of_turn(topics.MODEL_CALLS, request_id), key=lambda c: c["step"])
    iteration = _holding(client.of_turn(topics.ITERATIONS, request_id))
    check = _holding(client.of_turn(topics.TOOL_CALLS, request_id))
    batch = _holding(client.of_turn(topics.TOOL_BATCHES, request_id))

    forged = {  # name -> (topic, the copy, the service that must refuse it, what its reason must say)
        "model call for bob": (topics.MODEL_CALLS, _rewritten(model_call, BOB), "model", "customer"),
        "iteration for bob": (topics.ITERATIONS, _rewritten(iteration, BOB, bobs), "guard", "customer"),
        "tool calls for bob": (topics.TOOL_CALLS, _rewritten(check, BOB, bobs), "gate", "customer"),
        "batch for bob": (topics.TOOL_BATCHES, _rewritten(batch, BOB), "executor", "signature"),
        "batch on bob's order": (topics.TOOL_BATCHES, _rewritten(batch, order=bobs), "executor", "signature"),
        "batch resigned": (topics.TOOL_BATCHES, _rewritten(batch, signature="0" * 64), "executor", "signature"),
        "approval for bob": (topics.APPROVAL_REQUESTS, _rewritten(approval, BOB, bobs), "guard", "customer"),
        "approval on bob's order": (topics.APPROVAL_REQUESTS, _rewritten(approval, order=bobs), "guard", "edited"),
        "approval resigned": (
            topics.APPROVAL_REQUESTS,
            _rewritten(approval, hold_signature="0" * 128),
            "guard",
            "signature",
        ),
    }
    # the same step's calls with only the order rewritten: the gate authorizes them for Alice, whose order it is not
    await client.producer.send_and_wait(
        client.topic(topics.TOOL_CALLS), _rewritten(check, order=bobs), key=f"{conversation}:input".encode()
    )
    for name, (topic, value, _, _) in forged.items():
        await client.producer.send_and_wait(client.topic(topic), value, key=f"{conversation}:{name}".encode())

    found = await client.letters_keyed(conversation, set(forged))
    for name, (topic, _, service, why) in forged.items():
        letter = found[name]
        assert (letter["service"], letter["topic"]) == (service, client.topic(topic)), (name, letter)
        assert why in letter["reason"].lower(), (name, letter["reason"])
    assert "input" not in found  # an input the model could have sent too: refused as a call, not as a forgery

    await client.settled()  # every forged record handled: anything done (wrongly) for Bob would be on its topic
    assert shop_orders() == before
    for topic in (topics.MODEL_CALLS, topics.ITERATIONS, topics.TOOL_BATCHES, topics.APPROVAL_REQUESTS):
        for_bob = [
            m for m in client.seen[topic] if m.get("turn", {}).get("turn_id") == turn_id and BOB in json.dumps(m)
        ]
        ours = [v for t, v, _, _ in forged.values() if t == topic and BOB in v.decode()]
        assert len(for_bob) == len(ours), (topic, for_bob)  # only the attacker's own copies: no service made one
    input_batches = [  # what the gate signed for the copy whose order was rewritten (the attacker's keep the signature)
        b
        for b in client.of_turn(topics.TOOL_BATCHES, request_id)
        if bobs in json.dumps(b) and b["turn"]["customer_id"] == ALICE and b["signature"] != batch["signature"]
    ]
    assert input_batches and all(
        not c["approved"] and "not found" in c["error"]
        for b in input_batches
        for c in b["calls"]
        if bobs in json.dumps(c)
    ), input_batches

    denied = await asyncio.to_thread(
        roundtrip_cli, fleet_settings, "approvals", "deny", approval["approval_id"], "--reason", "test", "--by", "eve"
    )
    assert denied.returncode == 0, denied.stderr
    reply = await client.reply(request_id, timeout=60)
    assert reply.outcome is Outcome.END_TURN and reply.customer_id == ALICE and bobs not in reply.text
    await client.settled()  # every record handled: a second reply would be in `seen`
    assert len(client.replies[request_id]) == 1
    assert shop_orders() == before  # Alice's held cancellation was denied; Bob's order never touched
