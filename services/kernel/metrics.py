"""The fleet's Prometheus metrics, defined once; each is incremented where its decision is taken.

Served per process on /metrics by services/kernel/health.py, from prometheus_client's default
registry (which also carries the process collector: CPU seconds, resident memory, open fds).
The Kafka side (messages received/processed/published per topic, handler duration, in process)
comes from FastStream's KafkaPrometheusMiddleware, added in messaging.make_broker; its metrics
are prefixed `faststream_` and labelled `app_name="roundtrip-<service>"`.

| metric | type | labels | where |
| --- | --- | --- | --- |
| roundtrip_turns_total | counter | outcome | guard, when a turn ends (once per turn) |
| roundtrip_turn_steps | histogram | | guard, model calls of an ended turn |
| roundtrip_step_seconds | histogram | | guard, one round trip of the loop (decision to next decision of a turn) |
| roundtrip_tokens_total | counter | model, kind (input, output, cache_write, cache_read) | guard, per recorded step |
| roundtrip_cost_usd_total | counter | model | guard, per recorded step (the ledger's price table) |
| roundtrip_guard_drops_total | counter | reason (step_limit, repeated_call, cycle, failure_streak, budget, deadline, cancelled) | guard, when it stops a turn |
| roundtrip_guard_blocked_calls_total | counter | | guard, a repeat of a failed call not run |
| roundtrip_gate_rejections_total | counter | tool, reason | gate, per rejected call |
| roundtrip_tool_executions_total | counter | tool, result (ok, error) | executor, per approved call run |
| roundtrip_tool_duration_seconds | histogram | tool | executor, per approved call run |
| roundtrip_model_call_duration_seconds | histogram | model, result (ok, error) | model, per Messages API call (with the SDK's retries) |
| roundtrip_in_flight | gauge | service, subscription | any consumer: messages being handled now |
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from faststream._internal.middlewares import BaseMiddleware
from faststream.kafka.prometheus import KafkaPrometheusMiddleware
from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from services.kernel.events import Outcome, Usage

# The outcomes that mean "the guard stopped the turn" (the rest mirror the model's stop_reason, or the API failed).
GUARD_STOPS = frozenset({
    Outcome.STEP_LIMIT, Outcome.REPEATED_CALL, Outcome.CYCLE, Outcome.FAILURE_STREAK, Outcome.BUDGET, Outcome.DEADLINE,
    Outcome.CANCELLED,
})
TOKEN_KINDS = {
    "input_tokens": "input", "output_tokens": "output",
    "cache_creation_input_tokens": "cache_write", "cache_read_input_tokens": "cache_read",
}

turns = Counter("roundtrip_turns", "Turns ended, by outcome", ["outcome"])
turn_steps = Histogram("roundtrip_turn_steps", "Model calls per ended turn", buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30))
step_seconds = Histogram(
    "roundtrip_step_seconds", "One round trip of the loop: from a guard decision to the next one of the same turn",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60),
)
tokens = Counter("roundtrip_tokens", "Tokens of recorded model calls, by kind", ["model", "kind"])
cost_usd = Counter("roundtrip_cost_usd", "Cost of recorded model calls in USD (the configured price table)", ["model"])
guard_drops = Counter("roundtrip_guard_drops", "Turns the guard stopped, by reason", ["reason"])
guard_blocked_calls = Counter("roundtrip_guard_blocked_calls", "Repeats of a failed call the guard did not let run")
gate_rejections = Counter("roundtrip_gate_rejections", "Calls the gate rejected, by tool and reason", ["tool", "reason"])
tool_executions = Counter("roundtrip_tool_executions", "Approved tool calls run, by tool and result", ["tool", "result"])
tool_duration = Histogram(
    "roundtrip_tool_duration_seconds", "Time to run one approved tool call", ["tool"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
model_call_duration = Histogram(
    "roundtrip_model_call_duration_seconds", "Time of one Messages API call (the SDK's retries included)", ["model", "result"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120),
)
in_flight_messages = Gauge("roundtrip_in_flight", "Messages being handled right now", ["service", "subscription"])

_service = {"name": "unknown"}


def set_service(name: str) -> None:
    """The `service` label of this process's in-flight gauge (health.attach sets it)."""
    _service["name"] = name


def in_flight_gauge(subscription: str) -> Gauge:
    """The in-flight gauge of one subscription (a topic, or a consumer's name): `.set(n)`, `.inc()`, `.dec()`."""
    return in_flight_messages.labels(_service["name"], subscription)


@contextmanager
def in_flight(subscription: str) -> Iterator[None]:
    """`with metrics.in_flight("turn.tool_batches"): await handle(message)` counts the message while it is handled."""
    gauge = in_flight_gauge(subscription)
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()


def count_usage(model: str, usage: Usage, cost: float) -> None:
    for field, kind in TOKEN_KINDS.items():
        if value := getattr(usage, field):
            tokens.labels(model, kind).inc(value)
    cost_usd.labels(model).inc(cost)


def count_turn_end(outcome: Outcome | str, steps: int) -> None:
    outcome = Outcome(outcome)
    turns.labels(outcome.value).inc()
    turn_steps.observe(steps)
    if outcome in GUARD_STOPS:
        guard_drops.labels(outcome.value).inc()


class InFlightMiddleware(BaseMiddleware):
    """Counts each consumed message in `roundtrip_in_flight{subscription=<topic>}` while its handler runs."""

    async def consume_scope(self, call_next: Any, msg: Any) -> Any:
        with in_flight(getattr(getattr(msg, "raw_message", None), "topic", "?")):
            return await call_next(msg)


def broker_middlewares(service: str) -> list[Any]:
    """What make_broker adds for metrics: FastStream's Kafka metrics (faststream_*) and the in-flight gauge."""
    set_service(service)
    return [KafkaPrometheusMiddleware(registry=REGISTRY, app_name=f"roundtrip-{service}"), InFlightMiddleware]
