"""What one model call's attempts show: attributes of the model service's span and the limiter's Prometheus metrics."""

from __future__ import annotations

from opentelemetry import trace

from roundtrip._kernel.observability import metrics
from roundtrip._kernel.observability.telemetry import mark_error
from roundtrip._model.attempts import Tried
from roundtrip._model.capacity import Capacity


def observe(out: Tried, capacity: Capacity) -> None:
    """Span attributes of the call (only what differs from a plain first-time answer) and the limiter's metrics."""
    span = trace.get_current_span()
    metrics.model_rate_limit.set(capacity.rate or 0.0)
    metrics.model_capacity_wait.observe(out.waited_s)
    if out.refusals:
        metrics.model_refusals.inc(out.refusals)
    if capacity.rate is not None:
        span.set_attribute("roundtrip.model_rate_limit", round(capacity.rate, 3))
    if out.waited_s > 0.001:
        span.set_attribute("roundtrip.capacity_wait_s", round(out.waited_s, 3))
    if out.refusals:
        span.set_attribute("roundtrip.model_refusals", out.refusals)
    if out.attempts > 1:
        span.set_attribute("roundtrip.model_attempts", out.attempts)
    if out.error:
        mark_error(span, f"model call failed: {out.error}", "model_busy" if out.busy else "model_error")
