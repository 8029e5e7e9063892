"""Every part of FastStream the kernel uses that FastStream does not offer as public API, in one place.

The kernel lets FastStream do what it is good at (the connection, the consumer groups, the app's
lifecycle, the AsyncAPI document) and runs each message itself (services/_kernel/kafka/messaging.py:
FastStream's per-message loop and middleware chain cost a large share of every service's CPU:
docs/decisions/message-path.md). That needs FastStream's insides in four places:

* `replace_consume_loop(subscriber, loop)`: a Kafka subscriber with a handler starts its fetch
  loop in `start()` as `self.add_task(self._run_consume_loop, (self.consumer,))`. Setting the
  instance's `_run_consume_loop` makes FastStream start the key-ordered consumer's loop on the
  subscriber's own aiokafka consumer instead; the subscriber still joins its group, starts, stops
  and documents its channel as before.
* `kafka_producer(broker)`: the aiokafka producer the broker connected, at
  `broker.config.producer` (FastStream's producer) `._producer` (its state once connected)
  `.producer`. The kernel sends its JSON bytes straight to it: no codec, no header dict.
* `consume_loops_alive(subscriber)`: liveness from a subscriber's `running` flag and its `tasks`
  (one consume loop per consumer, `consumer_subgroup` when it has several).
* `MetricsContainer`, `ProcessingStatus`, `PublishingStatus`: FastStream's Prometheus metrics
  (`faststream_*`), which the kernel records itself (services/_kernel/observability/metrics.py), from modules the
  package `faststream.prometheus` does not export.

pyproject.toml allows the FastStream versions on which these were checked; how they are checked, and how to try another
version: docs/decisions/message-path.md, "The seams".
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
        # FastStream's insides (see the module's docstring): its producer protocol does not declare them
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
