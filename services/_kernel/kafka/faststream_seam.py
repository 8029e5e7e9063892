"""Every part of FastStream the kernel uses that FastStream does not offer as public API, in one place.

The kernel runs each message itself (docs/decisions/message-path.md, "The seams"): it replaces a subscriber's
consume loop, publishes on the aiokafka producer the broker connected, reads liveness from a subscriber's tasks
and records FastStream's Prometheus metrics from modules `faststream.prometheus` does not export.
pyproject.toml allows the FastStream versions on which these were checked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from faststream.exceptions import IncorrectState
from faststream.kafka import KafkaBroker
from faststream.prometheus.container import MetricsContainer
from faststream.prometheus.types import ProcessingStatus, PublishingStatus

__all__ = [
    "MetricsContainer",
    "ProcessingStatus",
    "PublishingStatus",
    "consume_loops_alive",
    "kafka_producer",
    "replace_consume_loop",
]

ConsumeLoop = Callable[[AIOKafkaConsumer], Awaitable[None]]

CONSUME_LOOP = "_run_consume_loop"  # what a Kafka subscriber's start() runs on its aiokafka consumer
PRODUCER_PATH = "broker.config.producer._producer.producer"


def replace_consume_loop(subscriber: Any, loop: ConsumeLoop) -> None:
    """Make the subscriber run `loop(its aiokafka consumer)` as its fetch loop, instead of FastStream's own."""
    setattr(subscriber, CONSUME_LOOP, loop)


def kafka_producer(broker: KafkaBroker) -> AIOKafkaProducer:
    """The aiokafka producer the broker connected (on the path of every publish: attribute reads only)."""
    try:
        producer = broker.config.producer._producer.producer  # type: ignore[attr-defined]
    except IncorrectState:  # FastStream's state of a producer before it connected
        raise RuntimeError("the broker is not connected") from None
    except AttributeError as missing:
        raise RuntimeError(f"the broker is not connected (or FastStream moved {PRODUCER_PATH}: {missing})") from missing
    if not isinstance(producer, AIOKafkaProducer):
        raise RuntimeError("the broker is not connected")
    return producer


def consume_loops_alive(subscriber: Any) -> bool:
    """The subscriber runs, with a live consume loop for each of its aiokafka consumers."""
    consumers = len(getattr(subscriber, "consumer_subgroup", None) or ()) or 1
    live = sum(1 for task in getattr(subscriber, "tasks", ()) if not task.done())
    return bool(subscriber.running) and live >= consumers
