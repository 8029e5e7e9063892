"""CPU the turn-shaped tracing adds per hop: `python -m tests.benchmarks.bench_telemetry`.

One hop = what a service does with one message of a turn, span-wise: a consumer span from the
record's headers, a handler span, the publish span of its output (3 spans, no exporter). "before"
is that with a plain TracerProvider and OpenTelemetry's W3C propagator; "after" is what the kernel
does per hop (services/_kernel/observability/telemetry.py): `publishing` (turn headers, the publish span's
traceparent) and `consuming` (turn span as parent, previous hop as link, messaging attributes),
with TurnSpanProcessor stamping roundtrip.turn_id, gen_ai.conversation.id and roundtrip.step on
each span. Figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from roundtrip._kernel.observability.telemetry import consuming, make_provider, publishing, tracer
from roundtrip._kernel.wire.events import CallModel, Turn

TURN = Turn(
    turn_id="turn_1",
    request_id="r",
    conversation_id="conv_1",
    customer_id="c",
    trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
    span_id="00f067aa0ba902b7",
)
CAUSE = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01"
_propagator = TraceContextTextMapPropagator()


def plain_hop(tracer) -> None:
    with (
        tracer.start_as_current_span(
            "t process", context=_propagator.extract({"traceparent": CAUSE}), kind=SpanKind.CONSUMER
        ),
        tracer.start_as_current_span("guard.decide"),
        tracer.start_as_current_span("t publish", kind=SpanKind.PRODUCER),
    ):
        _propagator.inject({})


def shaped_hop(tracer, body: CallModel, offset: int) -> None:
    with publishing("t", body, "conv_1") as headers:
        pass
    record = SimpleNamespace(
        topic="t", partition=0, offset=offset, timestamp=0, key=b"conv_1", value=b"{}", headers=headers
    )
    with consuming(record, "roundtrip-guard", frozenset()), tracer.start_as_current_span("guard.decide"):
        pass


def cpu_per_hop(tracer, shaped: bool, hops: int) -> float:
    body = CallModel(turn=TURN, step=1, messages=[])
    started = time.process_time()
    for offset in range(hops):
        if shaped:
            shaped_hop(tracer, body, offset)
        else:
            plain_hop(tracer)
    return (time.process_time() - started) / hops * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    before_tracer = TracerProvider().get_tracer("before")
    no_export = SimpleNamespace(otlp_endpoint=None, effective_span_file=None)
    trace.set_tracer_provider(make_provider("bench", no_export))  # the process's provider, as a service installs it
    after_tracer = tracer()
    before = min(cpu_per_hop(before_tracer, False, args.hops) for _ in range(args.rounds))
    after = min(cpu_per_hop(after_tracer, True, args.hops) for _ in range(args.rounds))
    print(
        f"CPU per hop (3 spans, no exporter): before {before:.1f} us, after {after:.1f} us, added "
        f"{after - before:.1f} us"
    )


if __name__ == "__main__":
    main()
