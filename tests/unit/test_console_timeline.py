"""The turn page's timeline (services/_console/timeline.py): a transcript joined with the turn's spans, as a person
reads it; and the turns list's order (stuck and awaiting first, a conversation's turns together)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from roundtrip._console import pages, timeline
from roundtrip._console.ledger_reader import in_reading_order
from tests.prices import price_table

MS = 1_000_000


def span(name, service, start_ms, took_ms, status_message=None, **attributes):
    return {
        "name": name,
        "service": service,
        "start_ns": start_ms * MS,
        "end_ns": (start_ms + took_ms) * MS,
        "status_message": status_message,
        "attributes": attributes,
    }


def model_span(step, start_ms, took_ms, stop, tokens_in, read=0, write=0, out=10):
    return span(
        "anthropic.messages.create",
        "roundtrip-model",
        start_ms,
        took_ms,
        **{
            "gen_ai.operation.name": "chat",
            "roundtrip.step": step,
            "gen_ai.request.model": "claude-sonnet-4-6",
            "gen_ai.usage.input_tokens": tokens_in + read + write,  # the conventions count cached tokens in
            "gen_ai.usage.cache_read.input_tokens": read,
            "gen_ai.usage.cache_write.input_tokens": write,
            "gen_ai.usage.output_tokens": out,
            "anthropic.message.stop_reason": stop,
        },
    )


HISTORY = [
    {"role": "user", "content": "my parcel is late"},
    {"role": "assistant", "content": [{"type": "text", "text": "It ships tomorrow."}]},
]
TURN = [
    {"role": "user", "content": "Cancel ord_1 and tell me about ord_2"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "tu_1", "name": "cancel_order", "input": {"order_id": "ord_1"}},
            {"type": "tool_use", "id": "tu_2", "name": "lookup_order", "input": {"order_id": "ord_2"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "tu_1", "content": "Not allowed: not your order", "is_error": True},
            {"type": "tool_result", "tool_use_id": "tu_2", "content": json.dumps({"order_id": "ord_2", "total": 4})},
        ],
    },
    {"role": "assistant", "content": [{"type": "text", "text": "ord_2 costs 4 EUR."}]},
]
SPANS = [
    model_span(1, 0, 900, "tool_use", 100, write=1500),  # a first attempt answered 429, then this one
    model_span(1, 0, 50, "", 0),
    span("guard.decide", "roundtrip-guard", 910, 5, **{"roundtrip.step": 1, "roundtrip.decision": "Continue"}),
    span(
        "gate.check_call",
        "roundtrip-gate",
        920,
        1,
        "rejected: Not allowed: not your order",
        **{"roundtrip.step": 1, "roundtrip.tool_use_id": "tu_1", "roundtrip.approved": False},
    ),
    span(
        "gate.check_call",
        "roundtrip-gate",
        921,
        1,
        **{"roundtrip.step": 1, "roundtrip.tool_use_id": "tu_2", "roundtrip.approved": True},
    ),
    span(
        "execute_tool lookup_order",
        "roundtrip-executor",
        930,
        42,
        **{"roundtrip.step": 1, "gen_ai.tool.call.id": "tu_2", "gen_ai.tool.name": "lookup_order"},
    ),
    model_span(2, 1000, 700, "end_turn", 20, read=1500, out=12),
    span(
        "guard.decide",
        "roundtrip-guard",
        1710,
        5,
        **{"roundtrip.step": 2, "roundtrip.decision": "Finish", "roundtrip.outcome": "end_turn"},
    ),
]


def test_a_turn_reads_as_its_steps_with_the_model_calls_verdicts_results_and_times():
    prices = price_table()
    tl = timeline.build(HISTORY + TURN, 2, SPANS, "end_turn", prices)
    assert tl.customer == ["Cancel ord_1 and tell me about ord_2"]
    assert tl.history == HISTORY
    first, second = tl.steps
    assert first.model is not None and first.model.attempts == 2
    # the model's last attempt counts; the cached tokens are not counted twice
    assert (first.model.latency_ms, first.model.input_tokens, first.model.cache_write_tokens) == (50.0, 0, 0)
    assert second.model is not None and second.model.latency_ms == 700.0
    assert (second.model.input_tokens, second.model.cache_read_tokens, second.model.output_tokens) == (20, 1500, 12)
    assert second.model.stop_reason == "end_turn"
    assert second.model.cost_usd == (20 * 3.0 + 12 * 15.0 + 1500 * 0.30) / 1_000_000
    assert first.text == "Let me look." and first.decision == "Continue" and second.decision == "Finish"
    rejected, ran = first.calls
    assert (rejected.verdict, rejected.reason, rejected.is_error) == ("rejected", "Not allowed: not your order", True)
    assert rejected.ran_ms is None
    assert (ran.verdict, ran.ran_ms, ran.result) == ("approved", 42.0, {"order_id": "ord_2", "total": 4})
    assert tl.ending == "The model finished its answer."


def test_a_running_turn_without_a_transcript_shows_what_its_spans_tell_and_no_ending():
    tl = timeline.build([], 0, SPANS[:6], None)
    (first,) = tl.steps
    assert [c.tool_use_id for c in first.calls] == ["tu_1", "tu_2"]
    assert [c.has_result for c in first.calls] == [False, False]
    assert tl.ending == "" and tl.customer == []


def test_the_guard_ending_names_the_rule_and_its_detail():
    spans = [
        span(
            "guard.decide",
            "roundtrip-guard",
            0,
            1,
            **{
                "roundtrip.step": 3,
                "roundtrip.outcome": "repeated_call",
                "roundtrip.detail": "lookup_order repeated after failing at step 1",
            },
        )
    ]
    ending = timeline.build([], 0, spans, "repeated_call").ending
    assert "repeated a call" in ending and "lookup_order repeated after failing at step 1" in ending


def test_a_long_result_is_pretty_printed_wrapped_and_collapsed_a_click_away():
    short = pages.result_html({"a": 1}, "k")
    assert "<details" not in short and "&quot;a&quot;: 1" in short
    long = pages.result_html({"orders": [{"order_id": f"ord_{i}", "note": "x" * 40} for i in range(40)]}, "k")
    assert long.startswith('<details data-key="k">') and "lines" in long and "\n  &quot;orders&quot;: [" in long


def test_turns_needing_someone_come_first_and_a_conversations_turns_together():
    def row(turn, conversation, status, started):
        return SimpleNamespace(turn_id=turn, conversation_id=conversation, status=status, started_at=started)

    rows = [
        row("t1", "c1", "ended", 10),
        row("t2", "c2", "ended", 20),
        row("t3", "c1", "ended", 30),
        row("t4", "c3", "stuck", 5),
        row("t5", "c2", "awaiting", 25),
    ]
    assert [r.turn_id for r in in_reading_order(rows)] == ["t5", "t4", "t3", "t1", "t2"]
