"""The kernel's subscriptions, outlets and dead-letter path, on the wiring of one service's broker.

Delivery is at least once: every subscription runs on a `KeyOrderedConsumer`, many messages in flight per
partition, one conversation at a time. A failure that says a dependency is unavailable (kafka/faults.py) is
retried, never dead-lettered; any other is dead-lettered with its reason, a failed dead letter retried by the
consumer's rescue. FastStream keeps the connection, groups, lifecycle and AsyncAPI document; the per-message path
is the kernel's own (docs/decisions/message-path.md).
"""

from __future__ import annotations

import base64
import contextvars
import functools
import inspect
import json
import logging
import time
import traceback
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from faststream import AckPolicy, FastStream
from faststream.kafka import KafkaBroker
from pydantic import BaseModel, ValidationError

from roundtrip._kernel.kafka import agent_digest, faults
from roundtrip._kernel.kafka.admin import DEAD_LETTER_MAX_BYTES
from roundtrip._kernel.kafka.clients import kafka_clients
from roundtrip._kernel.kafka.consumer import Commit, KeyOrderedConsumer
from roundtrip._kernel.kafka.faststream_metrics import KafkaMetrics
from roundtrip._kernel.kafka.faststream_seam import kafka_producer, replace_consume_loop
from roundtrip._kernel.observability import health
from roundtrip._kernel.observability.telemetry import consuming, mark_error, publishing
from roundtrip._kernel.settings import KafkaSettings, Settings
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.letters import DeadLettered
from roundtrip._kernel.wire.topology import group as group

log = logging.getLogger("roundtrip")

# Kafka answers a waiting fetch as soon as a record arrives: a long wait costs no latency, only idle polls.
IDLE_FETCH_WAIT_MS = 5000
MESSAGE_LOG_LEVEL = logging.DEBUG  # FastStream's "Received"/"Processed" line per message: CPU and no news at INFO

_record: contextvars.ContextVar[Any] = contextvars.ContextVar("roundtrip_record", default=None)
Failed = Callable[[Any, BaseException, str], Awaitable[None]]
LIVENESS_SILENCE_S = 60.0  # a consumer loop that has not polled for this long is wedged: restart the process


@dataclass(eq=False)
class Wiring:
    """One service's broker and what the kernel's subscriptions and outlets need to know of it."""

    service: str
    broker: KafkaBroker
    prefix: str = ""
    roots: frozenset[str] = frozenset()
    consumers: list[KeyOrderedConsumer] = field(default_factory=list)
    refuse: Callable[[], None] | None = None  # run at start, before the broker is contacted
    digest: agent_digest.Digest | None = None
    version: str = ""  # the agent version whose topics its subscriptions read (a versioned service only)
    metrics: KafkaMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = KafkaMetrics(self.service)

    def topic(self, name: str) -> str:
        return topics.t(name, self.prefix)


def wiring(service: str, settings: Settings, turn_roots: tuple[str, ...], digest: str) -> Wiring:
    """The service's broker and its wiring; `turn_roots`: the (logical) topics whose messages start turns."""
    kafka = kafka_clients(settings)
    broker = KafkaBroker(
        kafka.bootstrap_list,  # a list: FastStream takes a string as one host, "h1:9092,h2:9092" included
        **kafka.broker_options,
        client_id=f"roundtrip-{service}",
        enable_idempotence=True,
        linger_ms=0,
        # a dead letter is larger than its record (base64); the other topics keep the broker's own limit
        max_request_size=DEAD_LETTER_MAX_BYTES,
        logger=logging.getLogger(f"roundtrip.{service}"),
        log_level=MESSAGE_LOG_LEVEL,
        graceful_timeout=10.0,
    )
    return Wiring(
        service,
        broker,
        settings.topic_prefix,
        frozenset(topics.t(t, settings.topic_prefix) for t in turn_roots),
        refuse=functools.partial(settings.refuse_plaintext_kafka, service),
        digest=agent_digest.Digest(service, digest) if digest else None,
        version=settings.agent_version if service in topology.versioned() else "",
    )


def subscribe(
    wired: Wiring,
    topic: str,
    settings: KafkaSettings,
    *,
    role: str | None = None,
    max_in_flight: int | None = None,
    commit: Commit | None = None,
    forget: Any = None,
    commit_interval_s: float | None = None,
    cancel_on_revoke: bool = False,
    on_failure: Failed | None = None,
    description: str | None = None,
) -> Callable[[Callable[[Any], Awaitable[Any]]], Any]:
    """The decorator of a handler of `topic` (logical name): one pydantic message, consumed key-ordered.

    `commit` replaces the consumer's offset commit; `cancel_on_revoke`: the handler only waits, so a rebalance or a
    stop may cancel it; `on_failure(record, exc, reason)` runs before a failed record's dead letter."""
    service = wired.service
    declared = _declared(service, topic, role)
    group_id = group(service, role, settings.topic_prefix, wired.version)

    def register(handler: Callable[[Any], Awaitable[Any]]) -> Any:
        _check_message(handler, declared, topic)
        consumer = KeyOrderedConsumer(
            process=_message_path(wired, group_id, handler, on_failure),
            rescue=_rescuer(wired),
            name=f"{service}{'-' + role if role else ''}",
            max_in_flight=max_in_flight or settings.max_in_flight,
            commit_interval_s=settings.commit_interval_ms / 1000 if commit_interval_s is None else commit_interval_s,
            commit=commit,
            forget=forget,
            idle_wait_ms=IDLE_FETCH_WAIT_MS,
            cancel_on_revoke=cancel_on_revoke,
        )
        subscriber = wired.broker.subscriber(
            topics.t(topology.of_version(topic, wired.version), settings.topic_prefix),
            group_id=group_id,
            ack_policy=AckPolicy.MANUAL,  # the key-ordered consumer commits, never past an unfinished message
            auto_offset_reset="earliest",  # a new group reads what was published before it joined
            fetch_max_wait_ms=IDLE_FETCH_WAIT_MS,
            max_poll_records=None,
            listener=consumer,
            description=description,
        )
        replace_consume_loop(subscriber, consumer.run)
        if not wired.consumers:  # in the AsyncAPI document: where this service's refused records go
            letters = wired.topic(topics.dead_letters(service))
            wired.broker.publisher(letters, schema=DeadLettered, description=f"What {service} could not process")
        wired.consumers.append(consumer)
        return subscriber(handler)

    return register


def _check_message(handler: Callable[[Any], Awaitable[Any]], declared: topology.Input | None, topic: str) -> None:
    if declared is not None and _message_model(handler) is not declared.message:
        raise TypeError(
            f"{handler.__qualname__} takes {_message_model(handler).__name__}, but the topology says "
            f"{topic} carries {declared.message.__name__} (services/_kernel/wire/topology.py)"
        )


def _declared(service: str, topic: str, role: str | None) -> topology.Input | None:
    """The topology's declaration of this subscription (LookupError if none); None for a service outside it."""
    return topology.service(service).input(topic, role) if service in topology.names() else None


def current_record() -> Any:
    """The aiokafka ConsumerRecord whose handler is running (None outside one)."""
    return _record.get()


def _message_model(handler: Callable[..., Any]) -> type[BaseModel]:
    params = list(inspect.signature(handler).parameters)
    hints = typing.get_type_hints(handler)
    model = hints.get(params[0]) if len(params) == 1 else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(
            f"{handler.__qualname__}: a handler takes exactly one parameter annotated with a pydantic model"
        )
    return model


def _message_path(
    wired: Wiring,
    group_id: str,
    handler: Callable[[Any], Awaitable[Any]],
    on_failure: Failed | None,
) -> Callable[[Any], Awaitable[None]]:
    """One record through the handler: consumer span, metrics, decode, handle; a failure is dead-lettered."""
    model = _message_model(handler)
    roots, counted = wired.roots, wired.metrics

    async def process(record: Any) -> None:
        count = counted.received(record.topic, len(record.value or b""))
        token = _record.set(record)
        started = time.perf_counter()
        try:
            with consuming(record, group_id, roots) as span:
                try:
                    message = model.model_validate_json(record.value or b"")
                    if wired.digest is not None:
                        wired.digest.check(message, span)
                    await handler(message)
                except Exception as exc:  # the point is to never die on one message
                    reason = describe_error(exc, record.value)
                    log.debug("%s", traceback.format_exc())
                    if (dependency := faults.unavailable(exc)) is not None:
                        mark_error(span, f"retried later: {reason}", type(exc).__name__)
                        held = faults.of_backend(exc)  # a backend's: only this record's key waits
                        raise faults.RetryLater(
                            dependency, reason, backend=held is not None, until=held.until if held else None
                        ) from exc
                    mark_error(span, f"dead-lettered: {reason}", type(exc).__name__)
                    count.failed(type(exc).__name__)
                    if on_failure is not None:
                        await _tell(on_failure, record, exc, reason)
                    try:
                        await _publish_dead_letter(wired, record, reason)
                    except Exception as failed:  # the consumer's rescue retries the dead letter
                        raise DeadLetterFailed(reason) from failed
        finally:
            count.done(time.perf_counter() - started)
            _record.reset(token)

    return process


async def _tell(on_failure: Failed, record: Any, exc: BaseException, reason: str) -> None:
    try:
        await on_failure(record, exc, reason)
    except Exception as failed:  # noqa: BLE001 - the dead letter goes out whatever the hook does
        log.error(
            "%s[%s]@%s: the failure hook failed (%s); dead-lettering anyway",
            record.topic,
            record.partition,
            record.offset,
            describe_error(failed),
        )


def _assigned(consumer: KeyOrderedConsumer) -> bool:
    return bool(consumer.assigned)


def _no_outage(consumer: KeyOrderedConsumer) -> bool:
    return not consumer.outages


def _polled_lately(consumer: KeyOrderedConsumer) -> Callable[[], bool]:
    return lambda: time.monotonic() - consumer.last_poll < LIVENESS_SILENCE_S


def service_app(wired: Wiring, logger: logging.Logger, checks: health.Health) -> FastStream:
    """The service's FastStream app; on shutdown its consumers finish what runs and commit first."""
    app = FastStream(wired.broker, logger=logger)
    if wired.refuse is not None:  # before the broker is contacted: a PLAINTEXT Kafka outside development is refused
        app.on_startup(wired.refuse)

    @app.on_startup
    async def report_health() -> None:
        # live while its loop polls (paused or not); ready with its partitions and no dependency it waits for
        for consumer in wired.consumers:
            checks.live(f"consumer {consumer.name}", _polled_lately(consumer))
            checks.ready(f"consumer {consumer.name}", functools.partial(_assigned, consumer))
            checks.ready(f"dependencies of {consumer.name}", functools.partial(_no_outage, consumer))

    @app.on_shutdown
    async def drain_consumers() -> None:
        for consumer in wired.consumers:
            checks.unregister(f"consumer {consumer.name}")
            checks.unregister(f"dependencies of {consumer.name}")
            await consumer.drain()

    return app


def describe_error(exc: BaseException, body: Any = None) -> str:
    """Why a message could not be processed, in one line; never raises (any input, any depth)."""
    try:
        if isinstance(body, (bytes, str)):
            try:
                json.loads(body)
            except RecursionError:
                return "malformed JSON: nested too deep"
            except ValueError as bad:
                return f"malformed JSON: {bad}"
        if isinstance(exc, ValidationError):
            return (
                "schema violation: "
                + "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()[:10])[
                    :2000
                ]
            )
        if isinstance(exc, RecursionError):
            return "RecursionError: message nested too deep"
        head = getattr(exc, "reason_head", None)  # an exception that says what it is: letters are counted by it
        return f"{head if isinstance(head, str) else type(exc).__name__}: {_text(exc)}"[:2000]
    except BaseException:  # noqa: BLE001 - describing a failure must not fail
        return f"{type(exc).__name__} (undescribable)"


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001
        return "<unprintable>"


def dead_letter_of(service: str, record: Any, reason: str) -> DeadLettered:
    """The dead letter of a raw Kafka record: its bytes, key and headers kept losslessly (base64)."""
    value = record.value if isinstance(record.value, (bytes, type(None))) else str(record.value).encode()
    value = value or b""
    key = record.key if isinstance(record.key, (bytes, type(None))) else str(record.key).encode()
    headers = [
        {"key": str(k), "value_base64": base64.b64encode(v if isinstance(v, bytes) else str(v).encode()).decode()}
        for k, v in (record.headers or ())
    ]
    return DeadLettered(
        service=service,
        topic=record.topic,
        reason=reason,
        payload=value[:100_000].decode("utf-8", errors="replace"),
        payload_base64=base64.b64encode(value).decode(),
        key=key.decode("utf-8", errors="replace") if key is not None else None,
        key_base64=base64.b64encode(key).decode() if key is not None else None,
        headers=headers,
        partition=record.partition,
        offset=record.offset,
    )


class DeadLetterFailed(Exception):
    """Publishing a dead letter failed; the consumer's rescue retries it with the original reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def _publish_dead_letter(wired: Wiring, record: Any, reason: str) -> None:
    letter = dead_letter_of(wired.service, record, reason)
    log.error("dead-lettering %s[%s]@%s: %s", record.topic, record.partition, record.offset, reason)
    key = record.key if isinstance(record.key, bytes) else None
    await publish(wired, wired.topic(topics.dead_letters(wired.service)), letter, key)


def _rescuer(wired: Wiring) -> Callable[[Any, BaseException], Awaitable[None]]:
    """The consumer's last resort: dead-letter the raw record when handling it raised past the message path."""

    async def rescue(record: Any, exc: BaseException) -> None:
        reason = exc.reason if isinstance(exc, DeadLetterFailed) else describe_error(exc, record.value)
        await _publish_dead_letter(wired, record, reason)

    return rescue


async def publish(wired: Wiring, topic: str, message: BaseModel, key: bytes | None = None) -> None:
    """Publish one message (JSON) and wait for the broker's ack: one producer span, counted, on its producer."""
    conversation_id = key.decode("utf-8", "replace") if key is not None else ""
    started, failure = time.perf_counter(), None
    try:
        with publishing(topic, message, conversation_id) as headers:
            await (
                await kafka_producer(wired.broker).send(
                    topic, message.model_dump_json().encode(), key=key, headers=headers
                )
            )
    except Exception as exc:
        failure = type(exc).__name__
        raise
    finally:
        wired.metrics.published(topic, time.perf_counter() - started, failure)


def key_of(conversation_id: str) -> bytes:
    return conversation_id.encode()


class Outlet:
    """A declared publisher (so it shows in the AsyncAPI document) that keys by conversation id. A message of a
    versioned topic goes to its turn's version's copy: the turn's version routes it, whoever publishes it."""

    def __init__(self, wired: Wiring, topic: str, schema: type[BaseModel], description: str) -> None:
        if wired.service in topology.names():
            topology.service(wired.service).output(topic, schema)
        self._wired, self._topic, self._name = wired, wired.topic(topic), topic
        self._versioned = topic in topology.VERSIONED
        wired.broker.publisher(self._topic, schema=schema, description=description or schema.__doc__)

    async def __call__(self, message: BaseModel, conversation_id: str) -> None:
        version = version_of(message) if self._versioned else ""
        topic = self._wired.topic(topology.of_version(self._name, version)) if version else self._topic
        await publish(self._wired, topic, message, key_of(conversation_id))


def version_of(message: BaseModel) -> str:
    """The agent version of the turn `message` belongs to ("": the default version, or no turn)."""
    turn = getattr(message, "turn", None)
    return getattr(turn, "agent_version", "") or ""
