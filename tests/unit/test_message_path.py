"""The kernel's message path (services/_kernel/kafka/messaging.py) with a fake producer: decode, handle, dead-letter.

The real thing runs in every integration and e2e test; these pin what a record goes through."""

from __future__ import annotations

import asyncio
import base64
import json
from types import SimpleNamespace

import pytest
from faststream.kafka import KafkaBroker
from prometheus_client import REGISTRY

from roundtrip._kernel.kafka import messaging
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import CallModel, CancelTurn, Turn
from roundtrip._kernel.wire.letters import DeadLettered

# the records come from, and the dead letters go to, the topics of the settings the broker was made with
PREFIX = "unit."
SETTINGS = Settings(_env_file=None, topic_prefix=PREFIX)


class FakeProducer:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, bytes, bytes | None, list]] = []
        self.fail = fail

    async def send(self, topic, value, key=None, headers=None):
        if self.fail:
            raise ConnectionError("broker away")
        self.sent.append((topic, value, key, headers))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@pytest.fixture
def wired(monkeypatch):
    """A broker with one subscription whose handler records what it got; the producer is a fake."""
    producer = FakeProducer()
    monkeypatch.setattr(messaging, "kafka_producer", lambda broker: producer)
    wired = messaging.wiring("unitpath", SETTINGS, (), "")
    got: list = []
    behaviour = {"raise": None}

    @messaging.subscribe(wired, topics.TURN_CONTROLS, SETTINGS)
    async def on_cancel(command: CancelTurn) -> None:
        got.append((command, messaging.current_record(), in_flight()))
        if behaviour["raise"]:
            raise behaviour["raise"]

    (consumer,) = wired.consumers
    return SimpleNamespace(process=consumer.process, got=got, producer=producer, behaviour=behaviour)


def record(value: bytes, offset: int = 7):
    return SimpleNamespace(
        topic=topics.t(topics.TURN_CONTROLS, PREFIX),
        partition=0,
        offset=offset,
        timestamp=1_700_000_000_000,
        key=b"conv_1",
        value=value,
        headers=[("x-app", b"\xffraw")],
    )


def in_flight() -> float | None:
    return REGISTRY.get_sample_value(
        "roundtrip_in_flight", {"service": "unitpath", "subscription": topics.t(topics.TURN_CONTROLS, PREFIX)}
    )


def errors(topic: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "faststream_received_processed_messages_total",
            {"app_name": "roundtrip-unitpath", "broker": "kafka", "handler": topic, "status": "error"},
        )
        or 0.0
    )


def letter_of(producer: FakeProducer) -> DeadLettered:
    ((topic, value, key, _headers),) = producer.sent
    assert topic == topics.t(topics.dead_letters("unitpath"), PREFIX) and key == b"conv_1"  # its own, no other
    return DeadLettered.model_validate_json(value)


async def test_a_record_reaches_its_handler_as_the_model_with_the_record_at_hand_and_is_counted_while_handled(wired):
    rec = record(CancelTurn(turn_id="turn_1", reason="operator").model_dump_json().encode())
    await wired.process(rec)
    ((command, current, counted),) = wired.got
    assert isinstance(command, CancelTurn) and command.turn_id == "turn_1" and current is rec
    assert counted == 1 and in_flight() == 0  # roundtrip_in_flight{service, subscription=topic}
    assert messaging.current_record() is None and wired.producer.sent == []


@pytest.mark.parametrize(
    "value,reason",
    [
        (b"{not json", "malformed JSON: "),
        (json.dumps({"turn_id": 5}).encode(), "schema violation: turn_id: Input should be a valid string"),
    ],
)
async def test_a_record_its_handler_cannot_read_is_dead_lettered_with_the_reason_and_its_bytes(wired, value, reason):
    before = errors(topics.t(topics.TURN_CONTROLS, PREFIX))
    await wired.process(record(value))
    assert wired.got == []
    letter = letter_of(wired.producer)
    assert letter.reason.startswith(reason) and letter.service == "unitpath" and letter.offset == 7
    assert base64.b64decode(letter.payload_base64) == value
    assert letter.headers == [
        {"key": "x-app", "value_base64": base64.b64encode(b"\xffraw").decode()}
    ]  # kept losslessly
    assert errors(topics.t(topics.TURN_CONTROLS, PREFIX)) == before + 1


async def test_a_handler_that_raises_dead_letters_its_record_and_the_service_goes_on(wired):
    wired.behaviour["raise"] = ValueError("order ord_1 is not yours")
    await wired.process(record(CancelTurn(turn_id="turn_2").model_dump_json().encode()))
    assert letter_of(wired.producer).reason == "ValueError: order ord_1 is not yours"


async def test_a_handler_that_finds_the_database_away_is_retried_later_never_dead_lettered(wired):
    import sqlalchemy.exc

    from roundtrip._kernel.kafka import faults

    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")
    wired.behaviour["raise"] = sqlalchemy.exc.OperationalError("UPDATE turns", {}, refused)
    with pytest.raises(faults.RetryLater) as later:
        await wired.process(record(CancelTurn(turn_id="turn_3").model_dump_json().encode()))
    assert later.value.dependency == faults.DATABASE and "Connect call failed" in later.value.reason
    assert wired.producer.sent == []  # no dead letter: the consumer retries the record


async def test_a_backends_retry_later_stays_a_backends_with_its_deadline_and_anything_unmarked_is_the_fleets(wired):
    from roundtrip._kernel.kafka import faults

    try:
        raise faults.RetryLater(faults.HTTP, "ReadTimeout", backend=True, until=1_800_000_000.0)
    except faults.RetryLater as exc:
        wired.behaviour["raise"] = exc
    with pytest.raises(faults.RetryLater) as later:
        await wired.process(record(CancelTurn(turn_id="turn_4").model_dump_json().encode()))
    assert later.value.backend and later.value.until == 1_800_000_000.0 and later.value.dependency == faults.HTTP
    wired.behaviour["raise"] = ConnectionRefusedError(111, "Connect call failed")
    with pytest.raises(faults.RetryLater) as later:
        await wired.process(record(CancelTurn(turn_id="turn_5").model_dump_json().encode()))
    assert not later.value.backend and later.value.until is None
    assert wired.producer.sent == []


async def test_a_dead_letter_that_cannot_be_published_is_left_to_the_consumers_rescue_with_its_reason(wired):
    wired.producer.fail = True
    with pytest.raises(messaging.DeadLetterFailed) as failed:
        await wired.process(record(b"[]"))
    assert failed.value.reason.startswith("schema violation")


def test_a_handler_must_take_one_message_model():
    wired = messaging.Wiring("unitpath", KafkaBroker("127.0.0.1:1"))
    with pytest.raises(TypeError, match="exactly one parameter annotated with a pydantic model"):

        @messaging.subscribe(wired, topics.TURN_CONTROLS, SETTINGS)
        async def on_two(command: CancelTurn, other: int) -> None: ...


async def test_the_wiring_says_a_turn_started_under_another_agent_digest_and_still_handles_it(caplog):
    wired = messaging.wiring("digestpath", SETTINGS, (), "a" * 16)
    got: list = []

    @messaging.subscribe(wired, topics.MODEL_CALLS, SETTINGS)
    async def on_call(command: CallModel) -> None:
        got.append(command.turn.turn_id)

    (consumer,) = wired.consumers
    turn = Turn(turn_id="turn_d", request_id="r", conversation_id="c", customer_id="cus", agent_digest="b" * 16)
    value = CallModel(turn=turn, step=0, messages=[]).model_dump_json().encode()
    with caplog.at_level("WARNING", logger="roundtrip.agent"):
        await consumer.process(
            SimpleNamespace(**{**vars(record(value)), "topic": topics.t(topics.MODEL_CALLS, PREFIX)})
        )
    assert got == ["turn_d"]
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"turn turn_d was started under agent digest {'b' * 16}; this digestpath runs")
