"""CPU the turn-shaped tracing adds per hop: `python -m tests.benchmarks.bench_telemetry`.

One hop = what a service does with one message of a turn, span-wise: FastStream's consumer span from the
headers, a handler span, the create/publish spans of its output (4 spans, no exporter). "before" is a
plain TracerProvider; "after" adds what services/kernel/telemetry.py does per hop: HopMiddleware's
publish headers and consume (turn span as parent, previous hop as link) and TurnSpanProcessor stamping
roundtrip.turn_id, gen_ai.conversation.id and roundtrip.step on each span. Figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from types import SimpleNamespace

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.kernel.events import CallModel, Turn
from services.kernel.telemetry import HopMiddleware, make_provider

TURN = Turn(turn_id="turn_1", request_id="r", conversation_id="conv_1", customer_id="c",
            trace_id="4bf92f3577b34da6a3ce929d0e0e4736", span_id="00f067aa0ba902b7")
CAUSE = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01"
_propagator = TraceContextTextMapPropagator()


def spans_of_a_hop(tracer, headers: dict) -> None:
    with tracer.start_as_current_span("t process", context=_propagator.extract(headers), kind=SpanKind.CONSUMER):
        with tracer.start_as_current_span("guard.decide"):
            with tracer.start_as_current_span("t create", kind=SpanKind.PRODUCER):
                pass
            with tracer.start_as_current_span("t publish", kind=SpanKind.PRODUCER):
                pass


async def cpu_per_hop(tracer, shaped: bool, hops: int) -> float:
    hop = HopMiddleware(None, context=None)
    body = CallModel(turn=TURN, step=1, messages=[])

    async def sent(cmd) -> None:
        return None

    async def handled(msg) -> None:
        spans_of_a_hop(tracer, msg.headers)

    started = time.process_time()
    for offset in range(hops):
        headers = {"traceparent": CAUSE}
        if shaped:
            cmd = SimpleNamespace(body=body, headers={})
            await hop.publish_scope(sent, cmd)
            headers.update(cmd.headers)
            record = SimpleNamespace(topic="t", partition=0, offset=offset, timestamp=0, key=b"conv_1")
            await hop.consume_scope(handled, SimpleNamespace(headers=headers, raw_message=record))
        else:
            spans_of_a_hop(tracer, headers)
    return (time.process_time() - started) / hops * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    before_tracer, after_tracer = TracerProvider().get_tracer("before"), make_provider("bench").get_tracer("after")
    before = min(asyncio.run(cpu_per_hop(before_tracer, False, args.hops)) for _ in range(args.rounds))
    after = min(asyncio.run(cpu_per_hop(after_tracer, True, args.hops)) for _ in range(args.rounds))
    print(f"CPU per hop (4 spans, no exporter): before {before:.1f} us, after {after:.1f} us, added {after - before:.1f} us")


if __name__ == "__main__":
    main()
