"""OpenTelemetry set-up: one tracer provider per process, OTLP to Jaeger or a span file.

The Kafka hops are traced by FastStream's KafkaTelemetryMiddleware (W3C trace context in
the message headers); model calls by the anthropic SDK's own span; the rest by the
handlers through `tracer()`. `JsonLinesSpanExporter` is the local fallback when no
Jaeger is around: `roundtrip trace` reads it back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from services.kernel.settings import Settings

_provider: TracerProvider | None = None


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to a file (safe across processes: O_APPEND)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            ctx = span.get_span_context()
            record = {
                "trace_id": format(ctx.trace_id, "032x"),
                "span_id": format(ctx.span_id, "016x"),
                "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                "name": span.name,
                "service": span.resource.attributes.get("service.name"),
                "kind": span.kind.name,
                "start_ns": span.start_time,
                "end_ns": span.end_time,
                "status": span.status.status_code.name,
                "attributes": {k: v if isinstance(v, (str, int, float, bool)) else list(v) for k, v in (span.attributes or {}).items()},
                "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
            }
            os.write(self._fd, (json.dumps(record, default=str) + "\n").encode())
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        os.close(self._fd)


def setup_telemetry(service: str, settings: Settings) -> TracerProvider:
    """Install the process's tracer provider (idempotent)."""
    global _provider
    if _provider is not None:
        return _provider
    provider = TracerProvider(resource=Resource.create({"service.name": f"roundtrip-{service}"}))
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = settings.otlp_endpoint.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    span_file = settings.effective_span_file
    if span_file is not None:
        provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(span_file), schedule_delay_millis=500))
    trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def shutdown_telemetry() -> None:
    if _provider is not None:
        _provider.shutdown()


def tracer(name: str = "roundtrip") -> trace.Tracer:
    return trace.get_tracer(name)


def current_trace_id() -> str:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""
