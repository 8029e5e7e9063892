"""What an attacker holding one service's Kafka credentials writes for a genuine turn (issue 51): its end with
phishing text, a reply straight to the app, a cancel of the turn, a record that would hide a dead letter, and a
letter in the gateway's name. The broker must refuse each; a send of its own per topic, so a refusal leaves nothing
behind for the next."""

from __future__ import annotations

from collections.abc import Callable

from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError
from pydantic import BaseModel

from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import (
    CancelTurn,
    DeadLettered,
    DeadLetterHandled,
    SupportReply,
    Turn,
    TurnEnded,
    Usage,
)

FORGED = "PHISH: verify your card at evil.example"


def forged_for(genuine: SupportReply) -> dict[str, BaseModel]:
    """Each topic the executor may not write, and what an attacker would put there for `genuine`'s turn."""
    turn = Turn(
        turn_id=genuine.turn_id,
        request_id=genuine.request_id,
        conversation_id=genuine.conversation_id,
        customer_id=genuine.customer_id,
    )
    return {
        topics.OUTCOMES: TurnEnded(turn=turn, step=1, outcome="end_turn", text=FORGED, spent=Usage()),
        topics.SUPPORT_REPLIES: genuine.model_copy(update={"text": FORGED}),
        topics.TURN_CONTROLS: CancelTurn(
            turn_id=turn.turn_id, customer_id=turn.customer_id, conversation_id=turn.conversation_id, reason=FORGED
        ),
        topics.DEAD_LETTERS_HANDLED: DeadLetterHandled(
            letter_id="0-0", action="discard", claim="forged", by="alice@example.com", at=0.0, note=FORGED
        ),
        topics.dead_letters("gateway"): DeadLettered(
            service="gateway", topic=topics.SUPPORT_REQUESTS, reason="bad json", payload=FORGED
        ),
    }


async def sent(
    producer: Callable[[], AIOKafkaProducer], prefix: str, genuine: SupportReply
) -> dict[str, type[BaseException] | None]:
    """Send each forgery on a producer of `producer()`'s credentials; each topic's send error (None: taken)."""
    forged = {topic: message.model_dump_json().encode() for topic, message in forged_for(genuine).items()}
    return await each_sent(producer, prefix, forged, genuine.conversation_id.encode())


async def each_sent(
    producer: Callable[[], AIOKafkaProducer], prefix: str, records: dict[str, bytes], key: bytes | None = None
) -> dict[str, type[BaseException] | None]:
    """Send each topic's record on a producer of its own; each topic's send error (None: the broker took it)."""
    refused: dict[str, type[BaseException] | None] = {}
    for topic, value in records.items():
        client = producer()
        await client.start()
        try:
            await client.send_and_wait(prefix + topic, value, key=key)
            refused[topic] = None
        except TopicAuthorizationFailedError as exc:
            refused[topic] = type(exc)
        finally:
            await client.stop()
    return refused
