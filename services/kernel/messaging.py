"""The broker factory and the dead-letter middleware every service shares.

Delivery is at least once: subscribers commit after the handler returns
(`AckPolicy.ACK`), so a crash mid-handler redelivers the message. A message that
cannot be processed (bad JSON, schema violation, a bug) never kills the service:
`DeadLetterMiddleware` publishes it with the reason to the dead-letter topic and the
offset moves on.
"""

from __future__ import annotations

import json
import logging
import traceback
from typing import Any

from faststream import AckPolicy
from faststream._internal.middlewares import BaseMiddleware
from faststream.kafka import KafkaBroker
from faststream.kafka.opentelemetry import KafkaTelemetryMiddleware
from pydantic import BaseModel, ValidationError

from services.kernel import metrics, topics
from services.kernel.events import DeadLettered
from services.kernel.settings import Settings

log = logging.getLogger("roundtrip")

ACK_POLICY = AckPolicy.ACK  # commit after processing: at least once
IDLE_FETCH_WAIT_MS = 5000

# FastStream logs "Received" and "Processed" for every message at this level. At INFO that is
# two formatted log lines per hop in every service (measured: a few percent of each service's
# CPU, see docs/benchmarks.md); at DEBUG they show only with ROUNDTRIP_LOG_LEVEL=DEBUG.
MESSAGE_LOG_LEVEL = logging.DEBUG


def subscriber_options(
    service: str, settings: Settings, *, role: str | None = None, workers: int | None = None, topic: str | None = None
) -> dict[str, Any]:
    """Keyword arguments for `broker.subscriber(topic, **subscriber_options(...))`.

    Always: the service's consumer group, ACK after processing (at least once), and
    auto_offset_reset="earliest" (a new group reads what was published before it joined).
    `workers` > 1 processes that many partitions at once (FastStream's
    ConcurrentBetweenPartitionsSubscriber: one consumer per worker in the same group, each
    handling its partitions one message at a time, so per-partition, i.e. per-conversation,
    order and commit-after-processing are kept). It is capped at the topic's partition
    count; the subscriber must take exactly one topic. Use it for handlers that wait on I/O
    (the model API, the shop), not for handlers whose state is not safe to run concurrently.
    """
    options: dict[str, Any] = {
        "group_id": group(service, role),
        "ack_policy": ACK_POLICY,
        "auto_offset_reset": "earliest",
        # Kafka answers a waiting fetch as soon as a record arrives, so a long wait costs no latency;
        # it only makes an idle consumer ask less often (idle CPU of the fleet and the broker).
        "fetch_max_wait_ms": IDLE_FETCH_WAIT_MS,
    }
    if workers and workers > 1:
        partitions = settings.partitions
        if topic is not None and topic.endswith(topics.TOOL_BATCHES) and settings.executor_partitions:
            partitions = settings.executor_partitions
        options["max_workers"] = max(1, min(workers, partitions))
    return options


def describe_error(exc: BaseException, body: Any = None) -> str:
    if isinstance(body, (bytes, str)):
        try:
            json.loads(body)
        except ValueError as bad:
            return f"malformed JSON: {bad}"
    if isinstance(exc, ValidationError):
        return "schema violation: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()[:10]
        )
    return f"{type(exc).__name__}: {exc}"


class DeadLetterMiddleware(BaseMiddleware):
    """Sends any message whose handling raised to the dead-letter topic, with the reason."""

    service = "unknown"

    async def consume_scope(self, call_next: Any, msg: Any) -> Any:
        try:
            return await call_next(msg)
        except Exception as exc:  # noqa: BLE001 - the point is to never die on one message
            reason = describe_error(exc, msg.body)
            raw = getattr(msg, "raw_message", None)
            topic = getattr(raw, "topic", "?")
            log.error("dead-lettering a message from %s: %s", topic, reason)
            log.debug("%s", traceback.format_exc())
            body = msg.body if isinstance(msg.body, bytes) else str(msg.body).encode()
            key = getattr(raw, "key", None)
            letter = DeadLettered(
                service=self.service,
                topic=topic,
                reason=reason,
                payload=body.decode("utf-8", errors="replace")[:100_000],
                key=key.decode("utf-8", errors="replace") if isinstance(key, bytes) else key,
                partition=getattr(raw, "partition", None),
                offset=getattr(raw, "offset", None),
            )
            broker = self.context.get("broker")
            await broker.publish(letter, topic=topics.t(topics.DEAD_LETTERS), key=key)
            return None


def make_broker(service: str, settings: Settings) -> KafkaBroker:
    """The service's broker; spans go to the process's tracer provider (see telemetry.setup_telemetry)."""
    dead_letters = type(f"{service.title()}DeadLetters", (DeadLetterMiddleware,), {"service": service})
    return KafkaBroker(
        settings.bootstrap_servers,
        client_id=f"roundtrip-{service}",
        # metrics inside the dead letters: a message that raised counts as an exception, then is dead-lettered
        middlewares=[KafkaTelemetryMiddleware(), dead_letters, *metrics.broker_middlewares(service)],
        enable_idempotence=True,
        linger_ms=0,
        logger=logging.getLogger(f"roundtrip.{service}"),
        log_level=MESSAGE_LOG_LEVEL,
        graceful_timeout=10.0,
    )


def group(service: str, role: str | None = None) -> str:
    """The consumer group of a service's subscription: `roundtrip-<service>` for its main input,
    `roundtrip-<service>-<role>` for another one. One group per subscription, so subscriptions
    join (and rebalance) independently: a service with three inputs starts in one rebalance, not three."""
    return f"roundtrip-{service}" + (f"-{role}" if role else "")


def key_of(conversation_id: str) -> bytes:
    return conversation_id.encode()


class Outlet:
    """A declared publisher (so it shows in the AsyncAPI document) that keys by conversation id."""

    def __init__(self, broker: KafkaBroker, topic: str, schema: type[BaseModel], description: str = "") -> None:
        self._publisher = broker.publisher(topics.t(topic), schema=schema, description=description or schema.__doc__)

    async def __call__(self, message: BaseModel, conversation_id: str) -> None:
        await self._publisher.publish(message, key=key_of(conversation_id))
