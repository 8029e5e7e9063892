"""The real Jaeger v2 (scripts/jaeger.sh build) receives the project's OTLP/HTTP spans and serves them back.

Skipped with the reason when the binary is not built: `bash scripts/jaeger.sh build` (once, minutes).
"""

from __future__ import annotations

import time

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tests.jaeger import Jaeger, jaeger_binary

pytestmark = [
    pytest.mark.jaeger,
    pytest.mark.skipif(jaeger_binary() is None, reason="Jaeger v2 not built: run `bash scripts/jaeger.sh build`"),
]


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory):
    with Jaeger(log_file=tmp_path_factory.mktemp("jaeger") / "jaeger.log") as running:
        yield running


def test_a_span_exported_over_otlp_http_is_found_by_service_and_by_trace_id(jaeger):
    # the exporter set-up of services/_kernel/observability/telemetry.py (endpoint + /v1/traces), in our provider
    provider = TracerProvider(resource=Resource.create({"service.name": "roundtrip-jaegertest"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{jaeger.otlp_http_endpoint}/v1/traces")))
    tracer = provider.get_tracer("test")
    with (
        tracer.start_as_current_span("guard.decide", attributes={"roundtrip.turn_id": "turn_jaeger1"}) as parent,
        tracer.start_as_current_span("tool lookup_order"),
    ):
        pass
    trace_id = format(parent.get_span_context().trace_id, "032x")
    provider.shutdown()  # flushes

    deadline = time.monotonic() + 15
    while not (traces := jaeger.traces("roundtrip-jaegertest")) and time.monotonic() < deadline:
        time.sleep(0.2)  # poll interval: the trace in Jaeger's query API
    (found,) = traces
    assert found["traceID"] == trace_id
    spans = {s["operationName"]: s for s in found["spans"]}
    assert set(spans) == {"guard.decide", "tool lookup_order"}
    assert {"key": "roundtrip.turn_id", "type": "string", "value": "turn_jaeger1"} in spans["guard.decide"]["tags"]
    child_refs = spans["tool lookup_order"]["references"]
    assert child_refs and child_refs[0]["spanID"] == spans["guard.decide"]["spanID"]
    assert "roundtrip-jaegertest" in jaeger.services()
    assert jaeger.trace(trace_id)["traceID"] == trace_id
    assert jaeger.trace("0" * 31 + "1") is None


def test_the_helper_starts_instances_on_their_own_ports(jaeger):
    with Jaeger() as second:
        assert second.query_url != jaeger.query_url and second.otlp_http_endpoint != jaeger.otlp_http_endpoint
        assert second.services() == []  # in-memory storage: every instance starts empty
    assert second.process is None
