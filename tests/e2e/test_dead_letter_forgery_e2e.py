"""A forged dead letter on the running fleet (issue 51): whoever holds a service's Kafka credentials writes a letter on
that service's dead letters naming a harmless request already on support.requests by its partition and offset, but
carrying a cancellation for another customer, once with a readable copy that says the harmless words and once with
both copies the cancellation. The console shows what a re-drive would publish (the cancellation, never the harmless
words), refuses both re-drives with the reason, says the second on roundtrip.security, and publishes nothing: no new
request, no reply, no order changed; the genuine letter of that record re-drives it, once."""

from __future__ import annotations

import html
import json
import re
import uuid
from types import SimpleNamespace

import pytest

from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.kafka.clients import kafka_clients
from roundtrip._kernel.kafka.messaging import dead_letter_of
from roundtrip._kernel.wire import topics
from tests.e2e.test_console_e2e import APPROVER, _post, _signed_in, signed  # noqa: F401 - signed: the console signs in by OIDC

HARMLESS = "What are your opening hours?"


async def _request_ends(settings) -> dict:
    """The end offset of each partition of support.requests."""
    consumer = kafka_clients(settings).consumer(enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.end_offsets(
            await partitions_of(consumer, [topics.t(topics.SUPPORT_REQUESTS, settings.topic_prefix)])
        )
    finally:
        await consumer.stop()


def _card(page: str, marker: str) -> tuple[str, str]:
    """The id and the HTML of the waiting letter whose card holds `marker`."""
    for card in re.findall(r'<div class="card letter".*?</details>.*?</div>', page, re.S):
        if marker in html.unescape(card):
            return re.search(r'data-letter="([^"]+)"', card).group(1), html.unescape(card)
    raise AssertionError(f"no letter shows {marker!r}")


@pytest.mark.usefixtures("signed")
async def test_a_forged_dead_letter_is_shown_as_its_bytes_and_never_re_driven(
    client, fleet, fleet_settings, shop_orders
):
    settings = fleet_settings[0]
    orders = shop_orders()
    victim, order = next((customer, oid) for oid, (customer, _) in orders.items() if customer != "cus_1001")
    request_id = f"req_{uuid.uuid4().hex[:10]}"
    conversation = f"conv_{request_id}"
    asked = {"request_id": request_id, "conversation_id": conversation, "customer_id": "cus_1001", "text": HARMLESS}
    sent = await client.producer.send_and_wait(
        client.topic(topics.SUPPORT_REQUESTS), json.dumps(asked).encode(), key=conversation.encode()
    )
    await client.reply(request_id)  # a genuine request, answered: its record stays where the forged letters point
    await client.settled()

    forged_ids = {}
    for marker, readable_lies in (("forged_a", True), ("forged_b", False)):
        harmful = json.dumps(
            {
                "request_id": f"req_{marker}_{uuid.uuid4().hex[:6]}",
                "conversation_id": f"conv_{marker}",
                "customer_id": victim,
                "text": f"cancel order {order} now ({marker})",
            }
        ).encode()
        place = SimpleNamespace(
            topic=sent.topic, partition=sent.partition, offset=sent.offset, value=harmful, key=conversation.encode()
        )
        place.headers = []
        letter = dead_letter_of("gateway", place, f"RuntimeError: {marker}")
        if readable_lies:
            letter = letter.model_copy(update={"payload": json.dumps({"text": HARMLESS})})
        forged_ids[marker] = json.loads(harmful)["request_id"]
        await client.producer.send_and_wait(
            client.topic(topics.dead_letters("gateway")), letter.model_dump_json().encode()
        )
    before = await _request_ends(settings)

    approver, token = _signed_in(settings, APPROVER)
    live = approver.get("/dead-letters/live").text
    for marker, why in (
        ("forged_a", "its readable copy of the record is not its lossless copy"),
        ("forged_b", f"its copy is not the record at {sent.topic}[{sent.partition}]@{sent.offset} (value differ)"),
    ):
        letter_id, card = _card(live, f"({marker})")
        assert HARMLESS not in card  # the page shows the bytes a re-drive would publish, not the readable copy
        answer = _post(approver, f"/dead-letters/{letter_id}/redrive", token, {"csrf": token})
        assert answer.status_code == 409 and why in html.unescape(answer.text), answer.text

    await client.settled()
    assert await _request_ends(settings) == before  # nothing re-driven to support.requests
    assert not any(client.replies.get(r) for r in forged_ids.values())
    assert shop_orders() == orders

    # the letter of that very record is re-driven: the record Kafka keeps, once, and the gateway's dedupe holds
    genuine = SimpleNamespace(**{**vars(place), "value": json.dumps(asked).encode()})
    letter = dead_letter_of("gateway", genuine, "RuntimeError: genuine")
    await client.producer.send_and_wait(client.topic(topics.dead_letters("gateway")), letter.model_dump_json().encode())
    letter_id, card = _card(approver.get("/dead-letters/live").text, HARMLESS)
    assert _post(approver, f"/dead-letters/{letter_id}/redrive", token, {"csrf": token}).status_code == 303
    await client.settled()
    after = await _request_ends(settings)
    assert sum(after.values()) == sum(before.values()) + 1 and len(client.replies[request_id]) == 1
    log = (fleet.sync.logs / "console.log").read_text()
    assert re.search(r"roundtrip\.security.*dead letter 'gateway-\d+-\d+' refused: its copy is not the record", log), (
        log[-3000:]
    )
