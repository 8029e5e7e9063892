"""The shape of a turn's trace, piece by piece, with an in-memory exporter (the real one: test_jaeger_e2e.py)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from roundtrip._cli import following, observe
from roundtrip._kernel.observability import telemetry, traces
from roundtrip._kernel.observability.span_file import JsonLinesSpanExporter, span_files
from roundtrip._kernel.observability.telemetry import (
    STEP_HEADER,
    TURN_ID_HEADER,
    TURN_SPAN_HEADER,
    consuming,
    make_provider,
    new_turn_ids,
    publishing,
    record_turn_span,
    traceparent,
)
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.events import CallModel, ModelResponded, Turn, TurnFlagged, Usage

TRACE_ID, SPAN_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TURN = Turn(
    turn_id="turn_1",
    request_id="req_1",
    conversation_id="conv_7",
    customer_id="cus_1001",
    persona="careful",
    trace_id=TRACE_ID,
    span_id=SPAN_ID,
    started_at=1_700_000_000.25,
)


NO_EXPORT = SimpleNamespace(otlp_endpoint=None, effective_span_file=None)  # spans kept in memory only


@pytest.fixture
def traced():
    """The process's provider (a service's: turn-shaped, installed once) with an in-memory exporter of this test's
    spans."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(make_provider("unit", NO_EXPORT))
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield telemetry.tracer(), exporter
    exporter.shutdown()  # a provider keeps its processors: this one stops keeping spans


def hex_ids(span) -> tuple[str, str]:
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def test_the_turn_span_is_recorded_at_the_reply_with_the_ids_and_start_fixed_at_the_request(traced):
    tracer, exporter = traced
    usage = Usage(input_tokens=100, output_tokens=20, cache_creation_input_tokens=1000, cache_read_input_tokens=2000)
    ended_after = time.time_ns()
    record_turn_span(
        TURN,
        outcome="end_turn",
        steps=3,
        usage=usage,
        cost_usd=0.0123,
        model="claude-x",
        agent_name="support-agent",
        agent_digest="0123456789abcdef",
        provider="anthropic",
    )
    ended_before = time.time_ns()
    (span,) = exporter.get_finished_spans()
    assert span.name == "invoke_agent support-agent"
    assert hex_ids(span) == (TRACE_ID, SPAN_ID) and span.parent is None  # the root of the turn's trace
    assert span.start_time == 1_700_000_000_250_000_000 and ended_after <= span.end_time <= ended_before
    a = span.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "support-agent"
    assert a["roundtrip.agent.digest"] == "0123456789abcdef"  # which version of the agent ran the turn
    assert a["gen_ai.provider.name"] == "anthropic" and a["gen_ai.request.model"] == "claude-x"
    assert (
        a["gen_ai.conversation.id"] == "conv_7"
        and a["roundtrip.turn_id"] == "turn_1"
        and a["roundtrip.customer_id"] == "cus_1001"
    )
    assert a["roundtrip.outcome"] == "end_turn" and a["roundtrip.steps"] == 3 and a["roundtrip.cost_usd"] == 0.0123
    assert a["gen_ai.usage.input_tokens"] == 3100 and a["gen_ai.usage.output_tokens"] == 20  # cached input included
    assert a["gen_ai.usage.cache_read.input_tokens"] == 2000 and a["gen_ai.usage.cache_creation.input_tokens"] == 1000
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("end_turn",)
    assert span.status.status_code is StatusCode.UNSET

    # the ids were forced for that one span only
    with tracer.start_as_current_span("after") as after:
        pass
    assert hex_ids(after) != (TRACE_ID, SPAN_ID) and hex_ids(after)[0] != TRACE_ID


@pytest.mark.parametrize(
    "outcome,error",
    [("repeated_call", True), ("deadline", True), ("model_error", True), ("cancelled", False), ("refusal", False)],
)
def test_a_turn_the_guard_stopped_is_an_error_for_jaegers_error_filter(traced, outcome, error):
    _tracer, exporter = traced
    record_turn_span(
        TURN,
        outcome=outcome,
        steps=2,
        usage=Usage(),
        cost_usd=0.0,
        agent_name="support-agent",
        agent_digest="",
        model="",
        provider="anthropic",
    )
    (span,) = exporter.get_finished_spans()
    assert (span.status.status_code is StatusCode.ERROR) is error
    if error:
        assert span.attributes["error.type"] == outcome and span.attributes["roundtrip.error"] is True
        assert outcome in span.status.description


def test_publishing_a_message_of_a_turn_puts_the_turn_span_and_the_publish_span_in_its_headers(traced):
    _tracer, exporter = traced
    sent = []
    for message in (
        CallModel(turn=TURN, step=1, messages=[]),
        ModelResponded(turn=TURN, step=2, messages=[]),
        TurnFlagged(turn=TURN.model_copy(update={"span_id": ""}), step=1, idle_s=1, detail=""),
    ):
        with publishing("t.turn.x", message, "conv_7") as headers:
            sent.append(dict((k, v.decode()) for k, v in headers))
    publishes = exporter.get_finished_spans()
    assert [s.name for s in publishes] == ["t.turn.x publish"] * 3 and publishes[0].kind is SpanKind.PRODUCER
    assert publishes[0].attributes["messaging.destination.name"] == "t.turn.x"
    assert publishes[0].attributes["messaging.message.conversation_id"] == "conv_7"
    first = sent[0]
    assert (first[TURN_ID_HEADER], first[TURN_SPAN_HEADER], first[STEP_HEADER]) == (
        "turn_1",
        f"00-{TRACE_ID}-{SPAN_ID}-01",
        "2",
    )  # the next call
    assert first["traceparent"] == traceparent(*hex_ids(publishes[0]))  # the next hop links to this publish
    assert first["correlation_id"] == "conv_7" and first["content-type"] == "application/json"
    assert sent[1][STEP_HEADER] == "2"
    assert TURN_ID_HEADER not in sent[2] and "traceparent" in sent[2]  # a turn from before turn spans: a plain trace


def record(topic="t.turn.iterations", key=b"conv_7", offset=42, headers=None):
    return SimpleNamespace(
        topic=topic,
        partition=1,
        offset=offset,
        timestamp=1_700_000_000_123,
        key=key,
        value=b"{}",
        headers=[(k, v.encode()) for k, v in (headers or {}).items()],
    )


def consume(rec, tracer, roots=frozenset()):
    """The kernel's consumer span around a handler that starts a span and publishes."""
    seen = {}
    with consuming(rec, "roundtrip-guard", roots), tracer.start_as_current_span("guard.decide"):
        seen["new_turn"] = new_turn_ids()
        with tracer.start_as_current_span("x create", kind=SpanKind.PRODUCER):
            pass
    return seen


def test_a_hop_of_a_turn_is_parented_to_the_turn_span_and_linked_to_the_hop_before(traced):
    tracer, exporter = traced
    cause = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01"  # the previous hop's publish
    consume(
        record(
            headers={
                "traceparent": cause,
                TURN_ID_HEADER: "turn_1",
                TURN_SPAN_HEADER: traceparent(TRACE_ID, SPAN_ID),
                STEP_HEADER: "2",
                "correlation_id": "conv_7",
            }
        ),
        tracer,
    )
    spans = {s.name: s for s in exporter.get_finished_spans()}
    process, decide, create = spans["t.turn.iterations process"], spans["guard.decide"], spans["x create"]
    assert process.kind is SpanKind.CONSUMER and process.attributes["messaging.operation"] == "process"
    assert process.attributes["messaging.destination.name"] == "t.turn.iterations"
    assert process.attributes["messaging.kafka.message.offset"] == 42
    assert format(process.parent.span_id, "016x") == SPAN_ID  # the turn span, not the previous hop
    assert format(decide.parent.span_id, "016x") == hex_ids(process)[1]  # the handler's spans sit in the hop
    assert [format(link.context.span_id, "016x") for link in process.links] == ["1111111111111111"]
    assert decide.links == () and create.links == ()  # only the hop's consumer span is linked
    for span in (process, decide, create):
        assert (
            span.attributes["roundtrip.turn_id"] == "turn_1" and span.attributes["gen_ai.conversation.id"] == "conv_7"
        )
        assert span.attributes["roundtrip.step"] == 2
        assert hex_ids(span)[0] == TRACE_ID
    assert process.attributes["messaging.message.conversation_id"] == "conv_7"  # whatever correlation id the sender set
    assert "messaging.message.conversation_id" not in decide.attributes  # (producer spans: the Outlet's correlation id)

    # outside any hop nothing is stamped
    with tracer.start_as_current_span("idle"):
        pass
    assert "roundtrip.turn_id" not in exporter.get_finished_spans()[-1].attributes


def test_a_request_opens_its_turn_trace_with_ids_the_same_for_a_redelivery(traced):
    tracer, exporter = traced
    roots = frozenset({"t.support.requests"})
    client = "00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-2222222222222222-01"  # the app's own span: linked, not the parent
    first = consume(record("t.support.requests", headers={"traceparent": client}), tracer, roots)
    again = consume(record("t.support.requests"), tracer, roots)
    other = consume(record("t.support.requests", offset=43), tracer, roots)
    trace_id, span_id, received = first["new_turn"]
    assert (trace_id, span_id) == again["new_turn"][:2] != other["new_turn"][:2]
    assert abs(received - time.time()) < 5
    process = next(s for s in exporter.get_finished_spans() if s.name == "t.support.requests process")
    assert hex_ids(process)[0] == trace_id and format(process.parent.span_id, "016x") == span_id
    assert [format(link.context.span_id, "016x") for link in process.links] == ["2222222222222222"]
    # a message of another topic without turn headers (an operator's cancel) continues its sender's trace
    cancel = "00-cccccccccccccccccccccccccccccccc-3333333333333333-01"
    plain = consume(record("t.turn.controls", headers={"traceparent": cancel}), tracer, roots)
    assert plain["new_turn"][:2] != (trace_id, span_id)
    control = next(s for s in exporter.get_finished_spans() if s.name == "t.turn.controls process")
    assert hex_ids(control)[0] == "c" * 32 and format(control.parent.span_id, "016x") == "3" * 16


def test_the_span_file_is_rotated_and_bounded_across_writers(tmp_path, traced):
    tracer, exporter = traced
    for _ in range(3):
        with tracer.start_as_current_span("s", attributes={"roundtrip.turn_id": "turn_r", "pad": "x" * 500}):
            pass
    spans = exporter.get_finished_spans()
    path = tmp_path / "spans.jsonl"
    one, two = (
        JsonLinesSpanExporter(path, max_bytes=2000, backups=2),
        JsonLinesSpanExporter(path, max_bytes=2000, backups=2),
    )
    for i in range(12):
        (one if i % 2 else two).export(spans)  # two processes appending to one file
    one.shutdown()
    two.shutdown()
    files = span_files(path, 2)
    assert [f.name for f in files] == ["spans.jsonl.2", "spans.jsonl.1", "spans.jsonl"]
    assert not (tmp_path / "spans.jsonl.3").exists()
    for f in files:
        assert f.stat().st_size < 2000 + 3 * 1000  # a file passes the limit by one batch at most
        for line in f.read_text().splitlines():
            assert json.loads(line)["attributes"]["roundtrip.turn_id"] == "turn_r"  # whole lines, never torn


def test_roundtrip_trace_reads_the_rotated_span_files_too(tmp_path, capsys):
    path = tmp_path / "spans.jsonl"

    def line(span_id, parent, name, start):
        return (
            json.dumps(
                {
                    "trace_id": TRACE_ID,
                    "span_id": span_id,
                    "parent_id": parent,
                    "name": name,
                    "service": "roundtrip-guard",
                    "kind": "INTERNAL",
                    "start_ns": start,
                    "end_ns": start + 1_000_000,
                    "status": "UNSET",
                    "attributes": {"roundtrip.turn_id": "turn_9"},
                    "events": [],
                }
            )
            + "\n"
        )

    (tmp_path / "spans.jsonl.1").write_text(line(SPAN_ID, None, "invoke_agent support-agent", 0))
    path.write_text(line("1" * 16, SPAN_ID, "guard.decide", 1_000))
    settings = Settings(_env_file=None, span_file=path, otlp_endpoint=None, jaeger_query_url=None)
    assert observe.show_trace(settings, "turn_9") == 0
    out = capsys.readouterr().out
    assert (
        "invoke_agent support-agent" in out and "  guard.decide" in out
    )  # the child under its root from the older file


def test_a_jaeger_span_reads_like_a_span_file_record():
    span = {
        "traceID": TRACE_ID,
        "spanID": "1" * 16,
        "operationName": "guard.deadline",
        "processID": "p1",
        "startTime": 1_000,
        "duration": 500,
        "references": [{"refType": "CHILD_OF", "spanID": SPAN_ID}, {"refType": "FOLLOWS_FROM", "spanID": "2" * 16}],
        "tags": [
            {"key": "error", "type": "bool", "value": True},
            {"key": "otel.status_description", "value": "deadline: x"},
            {"key": "roundtrip.turn_id", "value": "turn_1"},
        ],
    }
    got = traces.jaeger_span(span, {"p1": {"serviceName": "roundtrip-guard"}})
    assert got["parent_id"] == SPAN_ID and got["links"] == ["2" * 16] and got["service"] == "roundtrip-guard"
    assert got["status"] == "ERROR" and got["status_message"] == "deadline: x"
    assert (got["start_ns"], got["end_ns"]) == (1_000_000, 1_500_000)


def test_the_jaeger_query_url_is_the_setting_or_derived_from_a_standard_otlp_endpoint():
    def url(**values):
        return Settings(_env_file=None, **values).effective_jaeger_query_url

    assert url(jaeger_query_url="http://jaeger:16686/") == "http://jaeger:16686"
    assert url(otlp_endpoint="http://localhost:4318") == "http://localhost:16686"
    assert url(otlp_endpoint="http://collector:4999") is None  # not Jaeger's port: do not guess
    assert url() is None


def test_roundtrip_ask_says_its_turn_is_stuck_and_where_it_waits(capsys):
    seen: dict = {}
    batch = {"turn": TURN.model_dump(), "step": 1, "messages": [], "calls": []}
    following._render("turn.tool_batches", batch, "req_1", seen, set())
    flagged = TurnFlagged(
        turn=TURN, step=1, idle_s=4.2, detail="no progress for 4.2 s after step 1; ending in 3 s unless it moves"
    )
    following._render("turn.events", flagged.model_dump(mode="json"), "req_1", seen, set())
    out = capsys.readouterr().out
    assert "turn turn_1 is stuck" in out and "no progress for 4.2 s" in out
    assert "waiting on an executor (turn.tool_batches)" in out and TRACE_ID in out
    following._render(
        "turn.events", flagged.model_dump(mode="json"), "req_other", seen, set()
    )  # another turn's: silent
    assert capsys.readouterr().out == ""


def test_a_span_started_by_the_sweeper_sits_under_the_turn_span_linked_to_the_last_hop(traced, monkeypatch):
    tracer, exporter = traced
    monkeypatch.setattr(telemetry, "tracer", lambda name="roundtrip": tracer)
    with (
        telemetry.span_in_turn(
            "guard.turn_stuck", TURN, "00-4bf92f3577b34da6a3ce929d0e0e4736-3333333333333333-01", step=2
        ),
        tracer.start_as_current_span("t create", kind=SpanKind.PRODUCER),
    ):
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    stuck = spans["guard.turn_stuck"]
    assert format(stuck.parent.span_id, "016x") == SPAN_ID and hex_ids(stuck)[0] == TRACE_ID
    assert [format(link.context.span_id, "016x") for link in stuck.links] == ["3" * 16]
    assert spans["t create"].attributes["roundtrip.turn_id"] == "turn_1"
    assert spans["t create"].attributes["gen_ai.conversation.id"] == "conv_7"
