import pytest

from roundtrip._guard.replies import Replies
from roundtrip._guard.rules import Continue, Finish, Policy, decide, history
from roundtrip._kernel.wire.events import ModelResponded, Outcome, ToolCall, Turn
from roundtrip._kernel.wire.fingerprints import fingerprint

TURN = Turn(turn_id="turn_1", request_id="r1", conversation_id="c1", customer_id="cus_1001")
POLICY = Policy(replies=Replies())


def call(name="lookup_order", **inp):
    inp = inp or {"order_id": "ord_0000dead"}
    return ToolCall(id=f"toolu_{name}_{sorted(inp.items())}", name=name, input=inp, fingerprint=fingerprint(name, inp))


class Transcript:
    """Builds the messages of a turn step by step, as the fleet would."""

    def __init__(self):
        self.messages = [{"role": "user", "content": "where is my order?"}]
        self.n = 0

    def step(self, *calls_and_errors):
        blocks, results = [], []
        for c, error in calls_and_errors:
            self.n += 1
            uid = f"toolu_{self.n}"
            blocks.append({"type": "tool_use", "id": uid, "name": c.name, "input": c.input})
            result = {"type": "tool_result", "tool_use_id": uid, "content": error or "{}"}
            if error:
                result["is_error"] = True
            results.append(result)
        self.messages += [{"role": "assistant", "content": blocks}, {"role": "user", "content": results}]
        return self

    def next(self, *calls, stop_reason="tool_use", content=None):
        step = sum(1 for m in self.messages if m["role"] == "assistant") + 1
        calls = list(calls)
        content = (
            content
            if content is not None
            else [
                {"type": "tool_use", "id": f"toolu_now{i}", "name": c.name, "input": c.input}
                for i, c in enumerate(calls)
            ]
        )
        calls = [c.model_copy(update={"id": f"toolu_now{i}"}) for i, c in enumerate(calls)]
        return ModelResponded(
            turn=TURN,
            step=step,
            messages=list(self.messages),
            content=content,
            stop_reason=stop_reason,
            tool_calls=calls,
        )


@pytest.mark.parametrize(
    "reason,outcome",
    [
        ("end_turn", Outcome.END_TURN),
        ("max_tokens", Outcome.MAX_TOKENS),
        ("stop_sequence", Outcome.STOP_SEQUENCE),
        ("refusal", Outcome.REFUSAL),
        ("model_context_window_exceeded", Outcome.CONTEXT_WINDOW_EXCEEDED),
        ("something_new", Outcome.UNKNOWN_STOP_REASON),
    ],
)
def test_finishing_stop_reasons_end_the_turn_with_that_outcome(reason, outcome):
    out = decide(Transcript().next(stop_reason=reason, content=[{"type": "text", "text": "Done."}]), POLICY)
    assert isinstance(out, Finish) and out.outcome is outcome and out.text.startswith("Done.")


def test_refusal_without_text_still_gets_a_polite_reply():
    out = decide(Transcript().next(stop_reason="refusal", content=[]), POLICY)
    assert out.outcome is Outcome.REFUSAL and "sorry" in out.text.lower()


def test_pause_turn_resumes_the_model():
    assert decide(
        Transcript().next(stop_reason="pause_turn", content=[{"type": "text", "text": "…"}]), POLICY
    ) == Continue(resume_model=True)


def test_model_error_ends_politely():
    event = Transcript().next(stop_reason=None).model_copy(update={"error": "OverloadedError (529)"})
    out = decide(event, POLICY)
    assert out.outcome is Outcome.MODEL_ERROR and "try again" in out.text.lower()


def test_step_limit():
    t = Transcript()
    for i in range(9):
        t.step((call(order_id=f"ord_0000000{i}"), None))
    out = decide(t.next(call(order_id="ord_00000010")), POLICY)
    assert isinstance(out, Finish) and out.outcome is Outcome.STEP_LIMIT


def test_a_rule_that_ends_the_turn_says_the_agents_words_and_the_model_keeps_its_own():
    from roundtrip._guard.rules import policy_from
    from roundtrip._kernel.settings import Settings

    words = Replies.of({"step_limit": "Wir haben hier angehalten.", "end_turn": "Noch etwas?"})
    policy = policy_from(Settings(_env_file=None, max_steps=10), words)  # as the guard's bootstrap builds it
    t = Transcript()
    for i in range(9):
        t.step((call(order_id=f"ord_0000000{i}"), None))
    out = decide(t.next(call(order_id="ord_00000010")), policy)
    assert (out.outcome, out.text) == (Outcome.STEP_LIMIT, "Wir haben hier angehalten.")
    assert decide(t.next(call(order_id="ord_00000010")), POLICY).text != out.text  # the defaults elsewhere
    answered = Transcript().next(
        stop_reason="end_turn", content=[{"type": "text", "text": "Ihre Bestellung ist unterwegs."}]
    )
    assert decide(answered, policy).text == "Ihre Bestellung ist unterwegs."


def test_history_reads_steps_fingerprints_and_failures_from_the_transcript():
    t = (
        Transcript()
        .step((call(), "Order not found"))
        .step((call("list_orders"), None), (call(order_id="ord_00000001"), None))
    )
    past = history(t.messages)
    assert [(c.step, c.name, c.failed) for c in past] == [
        (1, "lookup_order", True),
        (2, "list_orders", False),
        (2, "lookup_order", False),
    ]
    assert (
        past[0].fingerprint == fingerprint("lookup_order", {"order_id": "ord_0000dead"})
        and past[0].error == "Order not found"
    )


def test_first_repeat_of_a_failed_call_is_blocked_with_the_step_and_error():
    t = Transcript().step((call(), "Order ord_0000dead was not found."))
    out = decide(t.next(call()), POLICY)
    assert isinstance(out, Continue)
    (reason,) = out.blocked.values()
    assert (
        "already failed at step 1" in reason
        and "Order ord_0000dead was not found." in reason
        and "Change course" in reason
    )


def test_second_repeat_of_a_failed_call_ends_the_turn():
    t = Transcript().step((call(), "not found")).step((call(), "Not run: this exact call already failed"))
    out = decide(t.next(call()), POLICY)
    assert isinstance(out, Finish) and out.outcome is Outcome.REPEATED_CALL


def test_representation_changes_do_not_hide_a_repeat():
    t = Transcript().step((call(order_id="ord_0000dead"), "not found"))
    same = ToolCall(
        id="x",
        name="lookup_order",
        input={"order_id": "ord_0000dead"},
        fingerprint=fingerprint("lookup_order", {"order_id": "ord_0000dead"}),
    )
    assert decide(t.next(same), POLICY).blocked


def test_succeeding_identical_calls_are_capped():
    t = Transcript().step((call("list_orders", limit=5), None)).step((call("list_orders", limit=5), None))
    assert isinstance(decide(t.next(call("list_orders", limit=5)), POLICY), Continue)  # a third is allowed
    t.step((call("list_orders", limit=5), None))
    out = decide(t.next(call("list_orders", limit=5)), POLICY)
    assert isinstance(out, Finish) and out.outcome is Outcome.REPEATED_CALL


def test_alternating_cycle_is_caught_by_the_cycle_rule():
    a, b = call("lookup_order"), call("get_shipping_status")
    t = Transcript().step((a, "not found")).step((b, "not found")).step((a, "Not run: already failed"))
    out = decide(t.next(b), POLICY)
    assert isinstance(out, Finish) and out.outcome is Outcome.CYCLE


def test_streak_of_different_failing_calls_is_caught_by_the_streak_rule():
    t = Transcript()
    for i in range(4):
        t.step((call(order_id=f"ord_0000de0{i}"), "not found"))
    out = decide(t.next(call(order_id="ord_0000de09")), POLICY)
    assert isinstance(out, Finish) and out.outcome is Outcome.FAILURE_STREAK


def test_a_success_resets_the_streak():
    t = Transcript()
    for i in range(3):
        t.step((call(order_id=f"ord_0000de0{i}"), "not found"))
    t.step((call("list_orders"), None))
    assert isinstance(decide(t.next(call(order_id="ord_0000de09")), POLICY), Continue)


def test_loop_rules_off_leaves_only_the_step_limit():
    t = Transcript().step((call(), "not found")).step((call(), "not found"))
    assert decide(t.next(call()), Policy(loop_rules=False, replies=Replies())) == Continue()


def test_budget_ends_a_turn_that_would_exceed_it():
    out = decide(
        Transcript().next(call("list_orders")),
        Policy(budget_usd=0.01, replies=Replies()),
        cost_usd=0.008,
        next_call_usd=0.003,
    )
    assert isinstance(out, Finish) and out.outcome is Outcome.BUDGET
    assert isinstance(
        decide(Transcript().next(call("list_orders")), Policy(budget_usd=0.01, replies=Replies()), 0.004, 0.003),
        Continue,
    )
