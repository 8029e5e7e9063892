"""OpenTelemetry set-up: one tracer provider per process, OTLP to Jaeger or a span file; the shape of a turn's trace.

A turn is one trace whose root is the turn span (`invoke_agent <agent>`), its ids fixed by the gateway when the
request arrives and carried in the `Turn` of every event; each hop's consumer span is its child, linked to the
publish that caused it (docs/operating/tracing.md). The provider is process-wide because OpenTelemetry's is:
the SDK's own spans (the anthropic client's) find it through `trace.get_tracer_provider()`.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from roundtrip._kernel.observability.span_file import JsonLinesSpanExporter
from roundtrip._kernel.wire.topics import DEFAULT_VERSION_WORD


def turn_span_name(agent_name: str) -> str:
    return f"invoke_agent {agent_name}"


TURN_ID_HEADER = "roundtrip-turn-id"
TURN_SPAN_HEADER = "roundtrip-turn-span"
STEP_HEADER = "roundtrip-step"
_TRACEPARENT = "traceparent"
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)

# outcomes that fail the turn (Jaeger's error filter finds them); the rest ended as the model or an operator chose
ERROR_OUTCOMES = frozenset(
    {
        "step_limit",
        "repeated_call",
        "cycle",
        "failure_streak",
        "budget",
        "deadline",
        "model_error",
        "model_busy",
    }
)


class Hop:
    """What every span started while handling one message of a turn carries."""

    __slots__ = ("attributes", "cause", "conversation_id", "new_turn")

    def __init__(
        self,
        attributes: dict[str, Any],
        conversation_id: str,
        cause: SpanContext | None = None,
        new_turn: tuple[str, str, float] | None = None,
    ) -> None:
        self.attributes = attributes
        self.conversation_id = conversation_id
        self.cause = cause
        self.new_turn = new_turn


_hop: contextvars.ContextVar[Hop | None] = contextvars.ContextVar("roundtrip_hop", default=None)
_forced_ids: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("roundtrip_forced_ids", default=None)


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


def _span_context(value: str | bytes | None) -> SpanContext | None:
    """A W3C traceparent header as a (remote) span context; None when absent or malformed."""
    if not value:
        return None
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    parts = value.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        ctx = SpanContext(
            int(parts[1], 16), int(parts[2], 16), is_remote=True, trace_flags=TraceFlags(int(parts[3], 16) & 0xFF)
        )
    except ValueError:
        return None
    return ctx if ctx.is_valid else None


def turn_ids_for_record(topic: str, partition: int, offset: int, timestamp: int) -> tuple[str, str]:
    """Trace id and turn span id of the turn a request record starts: the same for a redelivery of that record."""
    digest = hashlib.blake2b(f"{topic}\x00{partition}\x00{offset}\x00{timestamp}".encode(), digest_size=24).digest()
    trace_id, span_id = digest[:16].hex(), digest[16:].hex()
    if int(trace_id, 16) == 0 or int(span_id, 16) == 0:  # pragma: no cover - 2**-64
        trace_id, span_id = format(random.getrandbits(128), "032x"), format(random.getrandbits(64), "016x")
    return trace_id, span_id


def new_turn_ids() -> tuple[str, str, float]:
    """(trace id, turn span id, start time) of the turn the current message starts (random outside a hop)."""
    hop = _hop.get()
    if hop is not None and hop.new_turn is not None:
        return hop.new_turn
    return format(random.getrandbits(128) or 1, "032x"), format(random.getrandbits(64) or 1, "016x"), time.time()


def bind_turn(turn_id: str) -> None:
    """The current message turned out to start `turn_id`: say so on the spans already started and those to come."""
    hop = _hop.get()
    if hop is not None:
        hop.attributes = {**hop.attributes, "roundtrip.turn_id": turn_id}
    trace.get_current_span().set_attribute("roundtrip.turn_id", turn_id)


def _step_of(message: Any) -> int | None:
    step = getattr(message, "step", None)
    if not isinstance(step, int):
        return None
    return step + 1 if type(message).__name__ == "CallModel" else step  # a CallModel starts the next model call


def turn_headers(message: Any) -> dict[str, str]:
    turn: Any = getattr(message, "turn", None)
    span_id = getattr(turn, "span_id", "")
    if not span_id:
        return {}
    headers = {TURN_ID_HEADER: turn.turn_id, TURN_SPAN_HEADER: traceparent(turn.trace_id, span_id)}
    step = _step_of(message)
    if step is not None:
        headers[STEP_HEADER] = str(step)
    return headers


def hop_of(
    topic: str, partition: int, offset: int, timestamp: int, key: Any, headers: dict[str, Any], roots: frozenset[str]
) -> tuple[Hop | None, str | None]:
    """The hop a consumed record is (None outside turns) and the traceparent its consumer span continues.
    A record of a turn-starting topic (`roots`) fixes the turn's ids from the record's coordinates."""
    conversation_id = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key or "")
    sender = headers.get(_TRACEPARENT)
    turn_span = headers.get(TURN_SPAN_HEADER)
    if turn_span:
        attributes: dict[str, Any] = {
            "roundtrip.turn_id": headers.get(TURN_ID_HEADER, ""),
            "gen_ai.conversation.id": conversation_id,
        }
        if step := headers.get(STEP_HEADER):
            with contextlib.suppress(ValueError):
                attributes["roundtrip.step"] = int(step)
        return Hop(attributes, conversation_id, _span_context(sender)), turn_span
    if topic in roots:
        trace_id, span_id = turn_ids_for_record(topic, partition, offset, timestamp)
        return (
            Hop(
                {"gen_ai.conversation.id": conversation_id},
                conversation_id,
                _span_context(sender),
                new_turn=(trace_id, span_id, time.time()),
            ),
            traceparent(trace_id, span_id),
        )
    return None, sender


@contextlib.contextmanager
def consuming(record: Any, group: str, roots: frozenset[str]) -> Iterator[trace.Span]:
    """The consumer span of one record (`<topic> process`), current while its handler runs, in its turn's trace."""
    headers = {k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v for k, v in (record.headers or ())}
    hop, parent = hop_of(record.topic, record.partition, record.offset, record.timestamp, record.key, headers, roots)
    parent_ctx = otel_context.Context()
    remote = _span_context(parent)
    if remote is not None:
        parent_ctx = trace.set_span_in_context(NonRecordingSpan(remote), parent_ctx)
    attributes: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.operation": "process",
        "messaging.destination.name": record.topic,
        "messaging.consumer.group.name": group,
        "messaging.kafka.destination.partition": record.partition,
        "messaging.kafka.message.offset": record.offset,
        "messaging.message.body.size": len(record.value or b""),
    }
    conversation_id = hop.conversation_id if hop else headers.get("correlation_id")
    if conversation_id:
        attributes["messaging.message.conversation_id"] = conversation_id
    if record.key is not None:
        attributes["messaging.kafka.message.key"] = hop.conversation_id if hop else str(record.key)
    links = [Link(hop.cause)] if hop is not None and hop.cause is not None else None
    token = _hop.set(hop) if hop is not None else None
    try:
        span = tracer("roundtrip.kafka").start_span(
            f"{record.topic} process", context=parent_ctx, kind=SpanKind.CONSUMER, attributes=attributes, links=links
        )
        with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
            yield span
    finally:
        if token is not None:
            _hop.reset(token)


@contextlib.contextmanager
def publishing(topic: str, message: Any, conversation_id: str) -> Iterator[list[tuple[str, bytes]]]:
    """The producer span of one publish (`<topic> publish`); yields the record's headers (the next hop links to it)."""
    attributes = {
        "messaging.system": "kafka",
        "messaging.operation": "publish",
        "messaging.destination.name": topic,
        "messaging.kafka.message.key": conversation_id,
        "messaging.message.conversation_id": conversation_id,
    }
    with tracer("roundtrip.kafka").start_as_current_span(
        f"{topic} publish", kind=SpanKind.PRODUCER, attributes=attributes, record_exception=False
    ) as span:
        headers = [(k, v.encode()) for k, v in turn_headers(message).items()]
        ctx = span.get_span_context()
        if ctx.is_valid:
            headers.append(
                (_TRACEPARENT, f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags) & 1:02x}".encode())
            )
        headers.append(("correlation_id", conversation_id.encode()))
        headers.append(("content-type", b"application/json"))
        yield headers


class TurnSpanProcessor(SpanProcessor):
    """Stamps the current hop's turn id, conversation id and step on every span it starts (the SDK's too)."""

    def on_start(self, span: Any, parent_context: otel_context.Context | None = None) -> None:
        hop = _hop.get()
        if hop is not None:
            span.set_attributes(hop.attributes)

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class TurnIdGenerator(IdGenerator):
    """Random ids, except for the one span `record_turn_span` starts with ids fixed when its turn began."""

    def generate_span_id(self) -> int:
        forced = _forced_ids.get()
        if forced:
            return forced.pop()
        span_id = random.getrandbits(64)
        while span_id == trace.INVALID_SPAN_ID:
            span_id = random.getrandbits(64)
        return span_id

    def generate_trace_id(self) -> int:
        forced = _forced_ids.get()
        if forced and len(forced) == 2:
            return forced.pop(0)
        trace_id = random.getrandbits(128)
        while trace_id == trace.INVALID_TRACE_ID:
            trace_id = random.getrandbits(128)
        return trace_id

    def is_trace_id_random(self) -> bool:
        return True


# gen_ai.provider.name per ROUNDTRIP_MODEL_PROVIDER, as the SDK's span of each call says it
PROVIDER_NAMES = {
    "anthropic": "anthropic",
    "bedrock": "aws.bedrock",
    "vertex": "gcp.vertex_ai",
    "foundry": "azure.ai.inference",
}


def record_turn_span(
    turn: Any,
    *,
    outcome: str,
    steps: int,
    usage: Any,
    cost_usd: float,
    agent_name: str,
    agent_digest: str,
    model: str,
    provider: str,
) -> trace.Span:
    """Record the finished turn span with the ids and start fixed when the turn began."""
    started = turn.started_at or time.time()
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": provider,
        "gen_ai.agent.name": agent_name,
        "gen_ai.conversation.id": turn.conversation_id,
        "roundtrip.turn_id": turn.turn_id,
        "roundtrip.request_id": turn.request_id,
        "roundtrip.customer_id": turn.customer_id,
        "roundtrip.outcome": outcome,
        "roundtrip.steps": steps,
        "roundtrip.cost_usd": cost_usd,
    }
    version = turn.agent_version
    attributes["roundtrip.agent.version"] = version or DEFAULT_VERSION_WORD  # a search finds either version's turns
    if agent_digest and not version:  # the reporting service runs the default version's agent
        attributes["roundtrip.agent.digest"] = agent_digest
    if model:
        attributes["gen_ai.request.model"] = model
    if usage is not None:
        attributes.update(_usage_attributes(usage))
    if outcome not in ERROR_OUTCOMES and outcome not in ("cancelled",):
        attributes["gen_ai.response.finish_reasons"] = [outcome]
    if turn.persona:
        attributes["roundtrip.persona"] = turn.persona
    if metadata := getattr(turn, "metadata", None):
        attributes["roundtrip.metadata"] = json.dumps(metadata, sort_keys=True, ensure_ascii=False)
    forced = [int(turn.trace_id, 16), int(turn.span_id, 16)] if turn.span_id and turn.trace_id else None
    token = _forced_ids.set(forced)
    try:
        span = tracer().start_span(
            turn_span_name(agent_name),
            context=otel_context.Context(),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=_ns(started),
        )
    finally:
        _forced_ids.reset(token)
    if outcome in ERROR_OUTCOMES:
        mark_error(span, f"turn ended: {outcome}", outcome)
    span.end()
    return span


def _usage_attributes(usage: Any) -> dict[str, int]:
    cache_write, cache_read = usage.cache_creation_input_tokens, usage.cache_read_input_tokens
    return {
        "gen_ai.usage.input_tokens": usage.input_tokens + cache_write + cache_read,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_creation.input_tokens": cache_write,
        "gen_ai.usage.cache_read.input_tokens": cache_read,
    }


def _ns(unix_seconds: float) -> int:
    return round(unix_seconds * 1e6) * 1000


def turn_context(turn: Any) -> otel_context.Context | None:
    if not (getattr(turn, "span_id", "") and turn.trace_id):
        return None
    parent = SpanContext(int(turn.trace_id, 16), int(turn.span_id, 16), is_remote=True, trace_flags=_SAMPLED)
    return trace.set_span_in_context(NonRecordingSpan(parent), otel_context.Context())


@contextlib.contextmanager
def span_in_turn(name: str, turn: Any, cause: str | None, step: int | None) -> Iterator[trace.Span]:
    """A span under the turn span (linked to `cause`, a traceparent), outside any hop: the guard's sweeper, a cancel."""
    parent = turn_context(turn)
    if parent is None:  # a turn from before turn spans: continue its last hop
        from opentelemetry.propagate import extract

        parent = extract({_TRACEPARENT: cause}) if cause else otel_context.get_current()
        with tracer().start_as_current_span(name, context=parent) as span:
            yield span
        return
    attributes: dict[str, Any] = {"roundtrip.turn_id": turn.turn_id, "gen_ai.conversation.id": turn.conversation_id}
    if step is not None:
        attributes["roundtrip.step"] = step
    cause_ctx = _span_context(cause)
    token = _hop.set(Hop(attributes, turn.conversation_id))
    try:
        links = [Link(cause_ctx, {"roundtrip.link": "last hop"})] if cause_ctx else None
        with tracer().start_as_current_span(name, context=parent, links=links) as span:
            yield span
    finally:
        _hop.reset(token)


def mark_error(span: trace.Span, reason: str, error_type: str | None) -> None:
    """Status ERROR with the reason, `error.type`, and `roundtrip.error=true`: a plain attribute every Jaeger
    storage can search (the in-memory one cannot search `error=true`)."""
    span.set_status(Status(StatusCode.ERROR, reason[:200]))
    span.set_attribute("roundtrip.error", True)
    if error_type:
        span.set_attribute("error.type", error_type)


class SpanExport(Protocol):
    """The settings a provider's exporters read: of TelemetrySettings, and the span file in effect (Settings')."""

    otlp_endpoint: str | None
    span_file_max_mb: float
    span_file_backups: int

    @property
    def effective_span_file(self) -> Path | None: ...


def make_provider(service: str, settings: SpanExport) -> TracerProvider:
    """A tracer provider that shapes turns (turn span ids, turn attributes on every span); exporters per `settings`."""
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"roundtrip-{service}"}), id_generator=TurnIdGenerator()
    )
    provider.add_span_processor(TurnSpanProcessor())
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = settings.otlp_endpoint.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    span_file = settings.effective_span_file
    if span_file is not None:
        exporter = JsonLinesSpanExporter(
            span_file, int(settings.span_file_max_mb * 1024 * 1024), settings.span_file_backups
        )
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    return provider


def setup_telemetry(service: str, settings: SpanExport) -> TracerProvider:
    """The process's provider, installed once in OpenTelemetry's registry (the one there already, if any)."""
    installed = trace.get_tracer_provider()
    if isinstance(installed, TracerProvider):
        return installed
    provider = make_provider(service, settings)
    trace.set_tracer_provider(provider)
    return provider


def shutdown_telemetry() -> None:
    if isinstance(installed := trace.get_tracer_provider(), TracerProvider):
        installed.shutdown()


# OpenTelemetry's own handles, made once: before the provider is installed each is a proxy that follows it
_TRACERS = MappingProxyType({name: trace.get_tracer(name) for name in ("roundtrip", "roundtrip.kafka")})


def tracer(name: str = "roundtrip") -> trace.Tracer:
    """OpenTelemetry's tracer `name` (the fleet's two are made at import: one a span costs no look-up)."""
    return _TRACERS.get(name) or trace.get_tracer(name)


def current_trace_id() -> str:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""
