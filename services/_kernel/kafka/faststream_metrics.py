"""FastStream's own Kafka metrics of one service (`faststream_*`, its `MetricsContainer`), recorded by the kernel's
message path instead of FastStream's per-message middleware. A service's `Wiring` holds its `KafkaMetrics`; their
series live in prometheus_client's process-wide registry, where FastStream's container finds them again.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from roundtrip._kernel.kafka.faststream_seam import MetricsContainer, ProcessingStatus, PublishingStatus
from roundtrip._kernel.observability.metrics import in_flight_messages


class _Received:
    """One subscription's metrics, children resolved once (a label look-up per message costs more than the count)."""

    __slots__ = ("_duration", "_exceptions", "_in_flight", "_in_process", "_labels", "_processed", "_size", "_total")

    def __init__(self, container: MetricsContainer, labels: dict[str, str], service: str, topic: str) -> None:
        self._labels = labels
        self._total = container.received_messages_total.labels(**labels)
        self._size = container.received_messages_size_bytes.labels(**labels)
        self._in_process = container.received_messages_in_process.labels(**labels)
        self._duration = container.received_processed_messages_duration_seconds.labels(**labels)
        self._exceptions = container.received_processed_messages_exceptions_total
        self._processed = {
            s: container.received_processed_messages_total.labels(**labels, status=s.value)
            for s in (ProcessingStatus.acked, ProcessingStatus.error)
        }
        self._in_flight = in_flight_messages.labels(service, topic)

    def __call__(self, size: int) -> _Record:
        self._total.inc()
        self._size.observe(size)
        self._in_process.inc()
        self._in_flight.inc()
        return _Record(self)


class _Record:
    __slots__ = ("_of", "_status")

    def __init__(self, of: _Received) -> None:
        self._of, self._status = of, ProcessingStatus.acked

    def failed(self, exception_type: str) -> None:
        self._status = ProcessingStatus.error
        self._of._exceptions.labels(**self._of._labels, exception_type=exception_type).inc()

    def done(self, seconds: float) -> None:
        of = self._of
        of._duration.observe(seconds)
        of._in_process.dec()
        of._in_flight.dec()
        of._processed[self._status].inc()


class KafkaMetrics:
    def __init__(self, service: str) -> None:
        self._container = MetricsContainer(REGISTRY, metrics_prefix="faststream", custom_label_names=())
        self._service, self._app = service, f"roundtrip-{service}"
        self._received: dict[str, _Received] = {}
        self._published: dict[str, tuple[Any, Any, Any]] = {}

    def received(self, topic: str, size: int) -> _Record:
        """A record of `topic` arrived; `.done(seconds)` when handled, `.failed(type)` first if it raised."""
        counted = self._received.get(topic)
        if counted is None:
            labels = {"app_name": self._app, "broker": "kafka", "handler": topic}
            counted = self._received[topic] = _Received(self._container, labels, self._service, topic)
        return counted(size)

    def published(self, topic: str, seconds: float, exception_type: str | None) -> None:
        children = self._published.get(topic)
        if children is None:
            labels = {"app_name": self._app, "broker": "kafka", "destination": topic}
            c = self._container
            children = self._published[topic] = (
                c.published_messages_duration_seconds.labels(**labels),
                c.published_messages_total.labels(**labels, status=PublishingStatus.success.value),
                c.published_messages_total.labels(**labels, status=PublishingStatus.error.value),
            )
        duration, ok, failed = children
        duration.observe(seconds)
        if exception_type is None:
            ok.inc()
        else:
            failed.inc()
            self._container.published_messages_exceptions_total.labels(
                app_name=self._app, broker="kafka", destination=topic, exception_type=exception_type
            ).inc()
