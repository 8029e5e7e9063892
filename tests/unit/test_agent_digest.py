"""A turn started under another agent digest is said by the service that sees it: a span attribute on every such
message and one log line per turn; the guard stamps the turns it starts with its own digest."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from roundtrip._kernel.kafka import agent_digest
from roundtrip._kernel.wire.events import CallModel, Turn


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test"), exporter


def call(digest: str, turn_id: str = "turn_1") -> CallModel:
    return CallModel(
        turn=Turn(turn_id=turn_id, request_id="r", conversation_id="c", customer_id="cus", agent_digest=digest),
        step=1,
        messages=[],
    )


def test_a_turn_of_another_digest_gets_a_span_attribute_each_time_and_one_log_line(spans, caplog):
    tracer, exporter = spans
    gate = agent_digest.Digest("gate", "a" * 16)
    with caplog.at_level(logging.WARNING, logger="roundtrip.agent"):
        for _ in range(2):
            with tracer.start_as_current_span("process") as span:
                assert gate.check(call("b" * 16), span)
    attributes = [dict(s.attributes) for s in exporter.get_finished_spans()]
    assert attributes == [{"roundtrip.agent.digest_mismatch": "b" * 16, "roundtrip.agent.digest": "a" * 16}] * 2
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        f"turn turn_1 was started under agent digest {'b' * 16}; this gate runs agent digest {'a' * 16}"
    )


def test_the_same_digest_an_unstamped_turn_or_a_process_that_named_none_say_nothing(spans, caplog):
    tracer, exporter = spans
    with tracer.start_as_current_span("process") as span:
        assert not agent_digest.Digest("echo", "").check(call("b" * 16), span)  # a service that named no digest
        model = agent_digest.Digest("model", "a" * 16)
        assert not model.check(call("a" * 16), span) and not model.check(call(""), span)
    assert not caplog.records and not exporter.get_finished_spans()[0].attributes
