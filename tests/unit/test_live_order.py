"""`roundtrip ask`'s live view shows each step in order, whatever order Kafka's fetches hand the records back in.

One poll of several topics returns each partition's records together, in no order between topics: a step's gate
verdict (turn.tool_batches) could come before its model line (turn.iterations), or a poll later than what followed
it."""

from __future__ import annotations

from roundtrip._cli import following
from roundtrip._cli.live_order import HOLD_S, StepOrder
from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import (
    CallModel,
    CheckedCall,
    CheckToolCalls,
    ExecuteToolBatch,
    ModelResponded,
    Outcome,
    SupportReply,
    ToolCall,
    Turn,
    Usage,
)
from tests.clocks import showing

TURN = Turn(turn_id="turn_1", request_id="req_1", conversation_id="conv_1", customer_id="cus_1001", trace_id="ab" * 16)
CALL = ToolCall(id="toolu_1", name="lookup_order", input={"order_id": "ord_x"}, fingerprint="f")
ASSISTANT = {
    "role": "assistant",
    "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup_order", "input": {}}],
}
RESULT = {
    "role": "user",
    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such order", "is_error": True}],
}


def _records(turn: Turn = TURN) -> dict[str, tuple[str, dict]]:
    """One turn of two steps: a failing lookup, then the answer; by name, as each is published."""

    def of(topic, message):
        return topic, message.model_dump(mode="json")

    return {
        "call0": of(topics.MODEL_CALLS, CallModel(turn=turn, step=0, messages=[])),
        "model1": of(
            topics.ITERATIONS, ModelResponded(turn=turn, step=1, messages=[], stop_reason="tool_use", tool_calls=[CALL])
        ),
        "check1": of(topics.TOOL_CALLS, CheckToolCalls(turn=turn, step=1, messages=[ASSISTANT], calls=[CALL])),
        "gate1": of(
            topics.TOOL_BATCHES,
            ExecuteToolBatch(
                turn=turn,
                step=1,
                messages=[ASSISTANT],
                calls=[
                    CheckedCall(
                        id="toolu_1",
                        name="lookup_order",
                        input={"order_id": "ord_x"},
                        approved=False,
                        error="Not allowed: not yours",
                    )
                ],
            ),
        ),
        "call1": of(topics.MODEL_CALLS, CallModel(turn=turn, step=1, messages=[ASSISTANT, RESULT])),
        "model2": of(topics.ITERATIONS, ModelResponded(turn=turn, step=2, messages=[], stop_reason="end_turn")),
        "reply": of(
            topics.SUPPORT_REPLIES,
            SupportReply(
                request_id=turn.request_id,
                conversation_id=turn.conversation_id,
                customer_id=turn.customer_id,
                turn_id=turn.turn_id,
                text="Sorry.",
                outcome=Outcome.END_TURN,
                steps=2,
                usage=Usage(),
                cost_usd=0.0,
                trace_id=turn.trace_id,
            ),
        ),
    }


def _shown(polls: list[list[str]], capsys) -> list[str]:
    """What the live view prints when the records arrive in these polls (names of `_records`), line by line."""
    records, order = _records(), StepOrder("req_1", SYSTEM)
    for poll in polls:
        for name in poll:
            order.add(*records[name])
        for topic, data in order.ready():
            if (reply := following._render(topic, data, "req_1", {}, set())) is not None:
                following.show_reply(reply)
    return [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip()]


def _positions(lines: list[str], *starts: str) -> list[int]:
    return [next(i for i, line in enumerate(lines) if line.startswith(start)) for start in starts]


IN_ORDER = ("step 1 model", "calls lookup_order", "gate  lookup_order", "error no such order", "step 2 model", "reply")


def test_a_gate_verdict_fetched_before_its_model_line_is_shown_after_it(capsys):
    lines = _shown([["call0", "gate1", "check1", "model1"], ["call1", "model2", "reply"]], capsys)
    positions = _positions(lines, *IN_ORDER)
    assert positions == sorted(positions), lines


def test_a_step_fetched_a_poll_later_than_what_followed_it_still_comes_first(capsys):
    lines = _shown([["call0"], ["gate1", "call1"], ["model2"], ["model1", "check1"], ["reply"]], capsys)
    positions = _positions(lines, *IN_ORDER)
    assert positions == sorted(positions), lines


def test_the_records_in_order_are_shown_as_they_come(capsys):
    lines = _shown([["call0", "model1"], ["check1", "gate1"], ["call1"], ["model2"]], capsys)
    assert lines[-1].startswith("step 2 model"), lines  # nothing held back: the last record is shown at once
    assert _positions(lines, *IN_ORDER[:-1]) == sorted(_positions(lines, *IN_ORDER[:-1]))


def test_a_record_whose_predecessor_never_comes_is_shown_after_the_hold(capsys):
    now = [100.0]
    records, order = _records(), StepOrder("req_1", showing(now))
    order.add(*records["gate1"])  # its model line was published before ask looked
    assert order.ready() == []
    now[0] += HOLD_S
    assert [topic for topic, _ in order.ready()] == [topics.TOOL_BATCHES]


def test_another_requests_records_are_not_shown(capsys):
    other = _records(TURN.model_copy(update={"request_id": "req_2", "turn_id": "turn_2"}))
    now = [0.0]
    order = StepOrder("req_1", showing(now))
    for topic, data in other.values():
        order.add(topic, data)
    now[0] += HOLD_S  # anything held would be due by now
    assert order.ready() == []


def test_a_steps_working_status_is_shown_before_its_model_line_whenever_it_arrives():
    records = _records()
    working = (
        topics.SUPPORT_STATUS,
        {"request_id": "req_1", "turn_id": "turn_1", "state": "working", "step": 2, "activity": "Looking up"},
    )
    order = StepOrder("req_1", showing([0.0]))
    for name in ("call0", "model1", "check1", "gate1", "call1", "model2"):
        order.add(*records[name])
    order.add(*working)  # the model line of step 2 came before its progress, in one poll
    shown = [(topic, data.get("step")) for topic, data in order.ready()]
    assert shown.index((topics.SUPPORT_STATUS, 2)) == shown.index((topics.ITERATIONS, 2)) - 1


def test_streamed_text_is_written_as_it_comes_once_and_a_cut_says_it_is_discarded(capsys):
    shown = following.TextShown("req_1")
    base = {"request_id": "req_1", "conversation_id": "conv_1", "customer_id": "cus_1001", "turn_id": "turn_1"}
    for chunk in (
        {"step": 1, "stream_id": "a", "sequence": 0, "text": "Let me "},
        {"step": 1, "stream_id": "a", "sequence": 0, "text": "Let me "},  # a duplicate: shown once
        {"step": 1, "stream_id": "a", "sequence": 1, "text": "look", "cut": False},
        {"step": 1, "stream_id": "a", "sequence": 2, "cut": True},
        {"step": 1, "stream_id": "b", "sequence": 0, "text": "Your order "},
        {"step": 1, "stream_id": "b", "sequence": 1, "text": "is on its way.", "final": True},
        {"step": 1, "stream_id": "c", "sequence": 0, "text": "not mine", "request_id": "req_2"},
    ):
        shown.show({**base, **chunk})
    out = capsys.readouterr().out
    assert "Let me look\n" in out and out.count("Let me") == 1 and "cut: discarded" in out
    assert "Your order is on its way.\n" in out and "not mine" not in out
