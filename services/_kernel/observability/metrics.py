"""The fleet's Prometheus metrics, defined once; each is incremented where its decision is taken.

Served per process on /metrics from prometheus_client's default registry. The Kafka side is FastStream's own metrics
(`faststream_*`), recorded by the kernel's message path (kafka/faststream_metrics.py). Each metric, its labels and
where it moves: the manual's page "Operating it".
"""

from __future__ import annotations

import re
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from roundtrip._kernel.wire.events import Outcome, Usage
from roundtrip._kernel.wire.topics import DEFAULT_VERSION_WORD, VERSION_NAME

GUARD_STOPS = frozenset(
    {
        Outcome.STEP_LIMIT,
        Outcome.REPEATED_CALL,
        Outcome.CYCLE,
        Outcome.FAILURE_STREAK,
        Outcome.BUDGET,
        Outcome.DEADLINE,
        Outcome.CANCELLED,
    }
)
TOKEN_KINDS = {
    "input_tokens": "input",
    "output_tokens": "output",
    "cache_creation_input_tokens": "cache_write",
    "cache_read_input_tokens": "cache_read",
}

turns = Counter("roundtrip_turns", "Turns ended, by outcome and agent version", ["outcome", "agent_version"])
turn_steps = Histogram(
    "roundtrip_turn_steps", "Model calls per ended turn", buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30)
)
step_seconds = Histogram(
    "roundtrip_step_seconds",
    "One round trip of the loop: from a guard decision to the next one of the same turn",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60),
)
tokens = Counter("roundtrip_tokens", "Tokens of recorded model calls, by kind", ["model", "kind"])
cost_usd = Counter("roundtrip_cost_usd", "Cost of recorded model calls in USD (the configured price table)", ["model"])
stuck_turns = Counter("roundtrip_stuck_turns", "Turns the sweeper flagged stuck (no progress past the stuck time)")
reply_seconds = Histogram(
    "roundtrip_reply_seconds",
    "From a request's arrival to its reply, by outcome, agent version and lane (the exemplar: the turn's trace id)",
    ["outcome", "agent_version", "lane"],
    buckets=(0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 900, 3600, 14400, 86400),  # a batch turn's: hours
)
approvals_waiting = Gauge("roundtrip_approvals_waiting", "Approvals waiting for a person's decision")
approval_oldest_wait = Gauge(
    "roundtrip_approval_oldest_wait_seconds", "How long the oldest approval still waiting has waited (0: none)"
)
guard_drops = Counter("roundtrip_guard_drops", "Turns the guard stopped, by reason", ["reason"])
guard_blocked_calls = Counter("roundtrip_guard_blocked_calls", "Repeats of a failed call the guard did not let run")
gate_rejections = Counter(
    "roundtrip_gate_rejections", "Calls the gate rejected, by tool and reason", ["tool", "reason"]
)
tool_executions = Counter(
    "roundtrip_tool_executions", "Approved tool calls run, by tool and result", ["tool", "result"]
)
tool_duration = Histogram(
    "roundtrip_tool_duration_seconds",
    "Time to run one approved tool call",
    ["tool"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
model_call_duration = Histogram(
    "roundtrip_model_call_duration_seconds",
    "Time of one model call (its retries and waits for capacity included)",
    ["model", "result"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120),
)
model_rate_limit = Gauge("roundtrip_model_rate_limit", "Calls per second this model service may start (0: not paced)")
model_refusals = Counter(
    "roundtrip_model_refusals", "Messages API answers 429 or 529 (the call waits and is tried again)"
)
model_capacity_wait = Histogram(
    "roundtrip_model_capacity_wait_seconds",
    "Time a model call waited for the API's capacity",
    buckets=(0.01, 0.1, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300),
)
model_waiting = Gauge("roundtrip_model_waiting", "Model calls waiting for the API's capacity now")
in_flight_messages = Gauge("roundtrip_in_flight", "Messages being handled right now", ["service", "subscription"])
dependency_unavailable = Gauge(
    "roundtrip_dependency_unavailable",
    "1 while the consumer waits for a dependency (its partitions paused, the failed messages retried)",
    ["consumer", "dependency"],
)
consumer_lag = Gauge(
    "roundtrip_consumer_lag",
    "Records of the consumer's assigned partitions not finished yet (the broker's end offsets less its progress)",
    ["consumer", "topic"],
)
held_keys = Gauge(
    "roundtrip_held_keys",
    "Keys (conversations) whose record waits for an agent's backend; the consumer's other keys go on",
    ["consumer"],
)
retried_messages = Counter(
    "roundtrip_retried_messages",
    "Messages retried because a dependency was unavailable (not dead-lettered)",
    ["consumer", "dependency"],
)
ledger_rows = Gauge("roundtrip_ledger_rows", "Turns in the ledger (PostgreSQL: the planner's estimate)")
ledger_oldest_ended = Gauge(
    "roundtrip_ledger_oldest_ended_seconds", "Age of the oldest ended turn the ledger keeps (0: none)"
)
ledger_deleted = Counter("roundtrip_ledger_deleted", "Ended turns deleted after ROUNDTRIP_LEDGER_RETENTION_S")
ignored_fields = Counter(
    "roundtrip_ignored_fields", "Fields of public messages the fleet does not know, ignored", ["message"]
)
refused_requests = Counter("roundtrip_refused_requests", "Requests answered invalid_request, by reason", ["reason"])


def count_usage(model: str, usage: Usage, cost: float) -> None:
    for field, kind in TOKEN_KINDS.items():
        if value := getattr(usage, field):
            tokens.labels(model, kind).inc(value)
    cost_usd.labels(model).inc(cost)


MAX_VERSION_LABELS = 20  # versions are few; a name past these (or no version's name) is counted as OTHER_VERSION
OTHER_VERSION = "(other)"
_versions_labelled: set[str] = set()


def version_label(version: str) -> str:
    """The `agent_version` label of a turn's version: its name, `default` for the default version. The name comes
    with the turn's messages, so the label's values are bounded here, not by whoever wrote them."""
    if not version:
        return DEFAULT_VERSION_WORD
    if version not in _versions_labelled:
        if len(_versions_labelled) >= MAX_VERSION_LABELS or not re.fullmatch(VERSION_NAME, version):
            return OTHER_VERSION
        _versions_labelled.add(version)
    return version


def count_turn_end(outcome: Outcome | str, steps: int, version: str) -> None:
    outcome = Outcome(outcome)
    turns.labels(outcome.value, version_label(version)).inc()
    turn_steps.observe(steps)
    if outcome in GUARD_STOPS:
        guard_drops.labels(outcome.value).inc()


def count_reply(turn: Any, outcome: str, now: float) -> None:
    """A turn's reply: its latency since the request arrived, by lane, its trace id as the exemplar (OpenMetrics)."""
    if not turn.started_at:
        return
    exemplar = {"trace_id": turn.trace_id} if turn.trace_id else None
    labels = reply_seconds.labels(outcome, version_label(turn.agent_version), turn.lane)
    labels.observe(max(0.0, now - turn.started_at), exemplar)
