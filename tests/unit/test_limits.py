"""The size policy: what no event may carry is replaced or cut, with a marker, whatever its depth or size."""

from __future__ import annotations

import json

from roundtrip._kernel.wire.limits import cap_text, fit_transcript, input_problem, json_size, too_deep


def nested(depth: int):
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_depth_is_measured_without_recursion_even_100k_deep():
    assert too_deep(nested(100_000), 32) is True
    assert too_deep(nested(32), 32) is False and too_deep(nested(33), 32) is True
    assert too_deep({"a": {"b": [1, 2, {"c": "d"}]}}, 4) is False


def test_input_problems_name_the_size_and_the_limit():
    assert input_problem({"order_id": "ord_1"}, 65536, 32) is None
    assert input_problem({"q": "x" * 70_000}, 65536, 32) == "input too large: 70008 bytes, limit 65536"
    assert input_problem({"q": nested(600)}, 65536, 32) == "input nested too deep: more than 32 levels, limit 32"


def test_long_texts_are_cut_with_a_marker_within_the_limit():
    text = "é" * 100_000
    cut = cap_text(text, 65536, "result")
    assert len(cut.encode()) <= 65536 and cut.endswith("[result truncated by roundtrip: 200000 bytes, limit 65536]")
    assert cap_text("short", 65536) == "short"


def test_a_transcript_is_fitted_by_replacing_its_largest_blocks_only():
    messages = [
        {"role": "user", "content": "cancel my order"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "search_help_center", "input": {"query": "q" * 300_000}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r" * 300_000, "is_error": False}],
        },
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "list_orders", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": '{"orders": []}'}]},
    ]
    original = json.dumps(messages)
    fitted, replaced = fit_transcript(messages, 400_000)
    assert json.dumps(messages) == original  # the caller's copy is untouched
    assert replaced == 1 and json_size(fitted) <= 400_000
    assert fitted[3:] == messages[3:] and fitted[0] == messages[0]  # small blocks are kept, pairs of ids intact
    assert [b["id"] for b in fitted[1]["content"]] == ["t1"] and fitted[2]["content"][0]["tool_use_id"] == "t1"
    assert "removed by roundtrip" in json.dumps(fitted[1:3])
    assert fit_transcript(messages, 1_000_000) == (messages, 0)
