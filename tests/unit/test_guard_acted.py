"""A turn that ends early after it acted says what was done and that nothing more was (issue 21, item 4)."""

from __future__ import annotations

import json
import time

import pytest

from roundtrip._guard.core import Guard
from roundtrip._guard.ledger import Ledger
from roundtrip._guard.replies import POLITE, Replies
from roundtrip._guard.rules import Policy
from roundtrip._guard.side_effects import SideEffects, generic
from roundtrip._kernel.storage import sideeffects
from roundtrip._kernel.storage.turnstore import Fence
from roundtrip._kernel.wire.events import (
    CallModel,
    CancelTurn,
    CheckedCall,
    ExecuteToolBatch,
    ModelResponded,
    Outcome,
    StartTurn,
    ToolCall,
    Turn,
    TurnEnded,
    Usage,
)
from roundtrip._kernel.wire.fingerprints import fingerprint
from roundtrip._shop.agent import AGENT as SHOP
from tests.agents import shop_deps, tool_runner
from tests.cores import executed
from tests.cores import guard as guard_of
from tests.databases import migrated
from tests.unit.test_approvals_flow import BATCHES, CANCEL, SIGNER
from tests.unit.test_guard_handlers import PRICES, Recorder

SHOP_SIDE_EFFECTS = SideEffects(SHOP.serial, SHOP.describe_action, Replies())


def use(tool_id: str, name: str, **args) -> dict:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": args}


def result(tool_id: str, content: object, error: bool = False) -> dict:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": json.dumps(content), "is_error": error}


CANCELLED = [
    {"role": "user", "content": "cancel my last order"},
    {"role": "assistant", "content": [use("t1", "list_orders")]},
    {"role": "user", "content": [result("t1", {"orders": [{"order_id": "ord_0000beef"}]})]},
    {
        "role": "assistant",
        "content": [
            use("t2", "cancel_order", order_id="ord_0000dead", reason="customer_request"),
        ],
    },
    {"role": "user", "content": [result("t2", "Order ord_0000dead cannot be cancelled: it has shipped.", error=True)]},
    {"role": "assistant", "content": [use("t3", "cancel_order", order_id="ord_0000beef", reason="customer_request")]},
    {"role": "user", "content": [result("t3", {"cancelled": True, "order": {"order_id": "ord_0000beef"}})]},
]


def test_only_the_side_effects_that_succeeded_are_done():
    assert SHOP_SIDE_EFFECTS.done(CANCELLED) == [
        "I cancelled order ord_0000beef"
    ]  # not the list, not the refused cancel
    unanswered = [
        *CANCELLED,
        {"role": "assistant", "content": [use("t4", "escalate_to_human", summary="s", urgency="low")]},
    ]
    assert SHOP_SIDE_EFFECTS.done(unanswered) == [
        "I cancelled order ord_0000beef"
    ]  # no result yet: not known to be done
    answered = [*unanswered, {"role": "user", "content": [result("t4", {"ticket_id": "tkt_1234abcd"})]}]
    assert SHOP_SIDE_EFFECTS.done(answered)[-1] == "I passed your request to our support team (ticket tkt_1234abcd)"
    assert SideEffects(frozenset(), None, Replies()).done(CANCELLED) == []  # no tool declared a side effect


@pytest.mark.parametrize(
    "outcome",
    [o for o in Outcome if o not in (Outcome.END_TURN, Outcome.CONVERSATION_REFUSED, Outcome.INVALID_REQUEST)],
)
def test_every_early_end_after_a_cancel_names_it_and_says_nothing_else_was_changed(outcome):
    text = SHOP_SIDE_EFFECTS.reply(outcome, POLITE[outcome], SHOP_SIDE_EFFECTS.done(CANCELLED))
    assert "I cancelled order ord_0000beef" in text and "Nothing else was changed" in text
    assert POLITE[outcome] not in text  # e.g. not "Nothing was changed after the error. Please try again"
    assert "try again" not in text.lower()


def test_the_plain_apology_when_nothing_was_done_and_the_models_answer_at_end_turn():
    nothing = CANCELLED[:3]
    assert (
        SHOP_SIDE_EFFECTS.reply(Outcome.MODEL_ERROR, POLITE[Outcome.MODEL_ERROR], SHOP_SIDE_EFFECTS.done(nothing))
        == POLITE[Outcome.MODEL_ERROR]
    )
    assert (
        SHOP_SIDE_EFFECTS.reply(Outcome.END_TURN, "I cancelled ord_0000beef.", SHOP_SIDE_EFFECTS.done(CANCELLED))
        == "I cancelled ord_0000beef."
    )


def test_the_models_own_words_stay_in_front_of_what_was_done():
    text = SHOP_SIDE_EFFECTS.reply(
        Outcome.MAX_TOKENS,
        f"I have cancelled your ord\n\n{POLITE[Outcome.MAX_TOKENS]}",
        SHOP_SIDE_EFFECTS.done(CANCELLED),
    )
    assert text.startswith("I have cancelled your ord\n\n") and "my answer was cut off" in text


def test_generic_words_without_the_agents_or_when_they_fail():
    plain = SideEffects(frozenset({"refund"}), None, Replies())
    messages = [
        {"role": "assistant", "content": [use("r1", "refund", amount=5)]},
        {"role": "user", "content": [result("r1", "ok")]},
    ]
    assert plain.done(messages) == ["refund succeeded"]  # its input is not shown: it may carry internal keys
    assert SideEffects(frozenset({"refund"}), lambda tool, args, text: None, Replies()).done(messages) == [
        "refund succeeded"
    ]
    assert SideEffects(frozenset({"refund"}), lambda tool, args, text: 1 / 0, Replies()).done(messages) == [
        "refund succeeded"
    ]


def test_the_generic_words_name_the_entities_only_never_an_internal_key_or_the_raw_input():
    args = {"line_id": "ln_5550101", "idempotency_key": "turn_9f:toolu_01", "note": "x" * 300}
    assert generic("port_out", args, "", fields=("line_id",)) == "port_out succeeded (line_id=ln_5550101)"
    acts = SideEffects(frozenset({"port_out"}), None, Replies(), shown={"port_out": ("line_id",)})
    messages = [
        {"role": "assistant", "content": [use("p1", "port_out", **args)]},
        {"role": "user", "content": [result("p1", "ok")]},
    ]
    said = acts.reply(Outcome.STEP_LIMIT, POLITE[Outcome.STEP_LIMIT], acts.done(messages))
    assert "ln_5550101" in said and "turn_9f" not in said and "idempotency" not in said and "xxx" not in said


def test_the_agents_template_per_outcome_and_its_default_word_an_early_end_after_a_side_effect():
    words = Replies.of(
        {"step_limit": "Zu viele Schritte."},
        {"repeated_call": "Ich habe aufgehört. Erledigt: {done}.", "default": "Abgebrochen. Erledigt: {done}."},
    )
    acts = SideEffects(frozenset({"refund"}), lambda tool, args, text: f"Erstattung {args['amount']} EUR", words)
    messages = [
        {"role": "assistant", "content": [use("r1", "refund", amount=5)]},
        {"role": "user", "content": [result("r1", "ok")]},
    ]
    done = acts.done(messages)
    assert acts.ending(Outcome.REPEATED_CALL, done) == "Ich habe aufgehört. Erledigt: Erstattung 5 EUR."
    assert acts.ending(Outcome.DEADLINE, done) == "Abgebrochen. Erledigt: Erstattung 5 EUR."
    # the model's words kept in front, the agent's own apology taken off
    assert acts.reply(Outcome.STEP_LIMIT, "Moment.\n\nZu viele Schritte.", done) == (
        "Moment.\n\nAbgebrochen. Erledigt: Erstattung 5 EUR."
    )


TURN = Turn(
    turn_id="turn_acted", request_id="req_a", conversation_id="conv_a", customer_id="cus_1001", trace_id="0" * 32
)
ESCALATE = ToolCall(
    id="t9",
    name="escalate_to_human",
    input={"summary": "s", "urgency": "low"},
    fingerprint=fingerprint("escalate_to_human", {"summary": "s", "urgency": "low"}),
)


@pytest.fixture
async def guard(tmp_path):
    ledger = await Ledger.open(await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"))
    recorder = Recorder()
    # max_steps=1: the first step that would call a tool ends the turn (step_limit)
    g = guard_of(
        ledger=ledger,
        policy=Policy(max_steps=1, replies=Replies()),
        prices=PRICES,
        publish=recorder,
        side_effects=SHOP_SIDE_EFFECTS,
    )
    g.recorder = recorder
    yield g
    await g.outbox.drain()
    await ledger.close()


async def ended_text(guard: Guard, event: ModelResponded) -> str:
    """The reply of the turn this iteration ends (its transcript holds the earlier steps; the ledger sees step 1)."""
    await guard.starts.on_start(StartTurn(turn=event.turn, text="cancel my last order"))
    await guard.loop.on_iteration(event)
    await guard.outbox.drain()
    (ended,) = [m for _, m in guard.recorder.sent if isinstance(m, TurnEnded)]
    return ended.text


async def test_the_guard_tells_the_truth_after_a_model_error_that_followed_a_cancel(guard):
    event = ModelResponded(
        turn=TURN,
        step=1,
        messages=CANCELLED,
        content=[],
        stop_reason=None,
        usage=Usage(),
        spent=Usage(),
        error="RateLimitError (429): rate limited",
    )
    text = await ended_text(guard, event)
    assert "I cancelled order ord_0000beef" in text and "Nothing was changed after the error" not in text


async def test_the_guard_tells_the_truth_when_its_step_limit_ends_a_turn_that_acted(guard):
    event = ModelResponded(
        turn=TURN,
        step=1,
        messages=CANCELLED,
        content=[{"type": "tool_use", "id": "t9", "name": ESCALATE.name, "input": ESCALATE.input}],
        stop_reason="tool_use",
        tool_calls=[ESCALATE],
        usage=Usage(),
        spent=Usage(),
    )
    text = await ended_text(guard, event)
    assert "more steps than I'm allowed" in text and "I cancelled order ord_0000beef" in text
    assert "escalate" not in text.lower() and "support team (ticket" not in text  # the call it was not allowed to run


async def test_an_earlier_turns_cancel_is_not_this_turns(guard):
    later = TURN.model_copy(update={"history_messages": len(CANCELLED) + 1})
    messages = [
        *CANCELLED,
        {"role": "assistant", "content": [{"type": "text", "text": "Cancelled."}]},
        {"role": "user", "content": "and where is my parcel?"},
    ]
    event = ModelResponded(
        turn=later,
        step=1,
        messages=messages,
        content=[],
        stop_reason=None,
        usage=Usage(),
        spent=Usage(),
        error="APIConnectionError: down",
    )
    assert await ended_text(guard, event) == POLITE[Outcome.MODEL_ERROR]


# -- an end from outside the loop: what the executor recorded in the turn's row ---------------------------------------

ALICE = Turn(
    turn_id="turn_out", request_id="req_o", conversation_id="conv_o", customer_id="cus_1001", trace_id="0" * 32
)


def test_the_recorded_lines_keep_only_successful_serial_calls_each_once():
    calls = [
        CheckedCall(id="c1", name="cancel_order", input=CANCEL, approved=True),
        CheckedCall(id="c2", name="lookup_order", input={"order_id": "ord_1"}, approved=True),
        CheckedCall(id="c3", name="cancel_order", input={"order_id": "ord_2"}, approved=True),
    ]
    results = [
        {"tool_use_id": "c1", "content": '{"cancelled": true}'},
        {"tool_use_id": "c2", "content": "{}"},
        {"tool_use_id": "c3", "content": "not cancellable", "is_error": True},
    ]
    lines = sideeffects.lines(calls, results, SHOP.registry.is_serial)
    assert [e["id"] for e in sideeffects.read(lines + lines + "not json\n")] == ["c1"]  # a redelivery appends it again
    assert SHOP_SIDE_EFFECTS.recorded(lines) == ["I cancelled order ord_a1000003"]
    assert sideeffects.lines(calls[1:2], results[1:2], SHOP.registry.is_serial) == "" and sideeffects.read(None) == []


ASKED = [
    {"role": "user", "content": "cancel my last order"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "cancel_order", "input": CANCEL}]},
]
CHECKED = CheckedCall(id="c1", name="cancel_order", input=CANCEL, approved=True)


@pytest.fixture
async def deciding(tmp_path):
    """A guard, the fence and the recorder, with Alice's turn at step 1: the model asked to cancel ord_a1000003."""
    url = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    ledger, fence = await Ledger.open(url), await Fence.open(url)
    recorder = Recorder()
    guard = guard_of(
        ledger=ledger, policy=Policy(replies=Replies()), prices=PRICES, publish=recorder, side_effects=SHOP_SIDE_EFFECTS
    )
    await guard.starts.on_start(StartTurn(turn=ALICE, text="cancel my last order"))
    cancel = ToolCall(id="c1", name="cancel_order", input=CANCEL, fingerprint=fingerprint("cancel_order", CANCEL))
    await guard.loop.on_iteration(
        ModelResponded(
            turn=ALICE,
            step=1,
            messages=ASKED[:1],
            content=ASKED[1]["content"],
            stop_reason="tool_use",
            tool_calls=[cancel],
            usage=Usage(),
            spent=Usage(),
        )
    )
    yield guard, fence, recorder
    await guard.outbox.drain()
    await fence.close()
    await ledger.close()


async def test_an_operators_cancel_after_the_executor_cancelled_names_what_it_did(deciding, shop):
    guard, fence, recorder = deciding
    runner = tool_runner(SHOP.registry, shop_deps(shop))
    batch = SIGNER.sign(ExecuteToolBatch(turn=ALICE, step=1, messages=ASKED, calls=[CHECKED]))
    assert isinstance(await executed(batch, BATCHES, runner, fence), CallModel)
    assert (await shop.get_order("cus_1001", "ord_a1000003"))["status"] == "cancelled"
    assert await fence.claim_model_call(
        ALICE, 1, now=time.time()
    )  # the next model call is on its way (the lease released)
    assert (
        await guard.external_ends.on_cancel(
            CancelTurn(turn_id=ALICE.turn_id, customer_id=ALICE.customer_id, conversation_id=ALICE.conversation_id)
        )
        == "cancelled"
    )
    await guard.outbox.drain()
    (ended,) = [m for _, m in recorder.sent if isinstance(m, TurnEnded)]
    assert ended.outcome is Outcome.CANCELLED
    assert "our support team stopped it" in ended.text and "I cancelled order ord_a1000003" in ended.text
    assert POLITE[Outcome.CANCELLED] not in ended.text


async def test_a_cancel_decided_while_the_cancel_runs_says_what_it_did_once_the_step_is_done(deciding):
    guard, fence, recorder = deciding
    assert await fence.claim_batch(ALICE, 1, lease_s=60, now=time.time())  # the executor runs the cancel...
    assert (
        await guard.external_ends.on_cancel(
            CancelTurn(turn_id=ALICE.turn_id, customer_id=ALICE.customer_id, conversation_id=ALICE.conversation_id)
        )
        == "cancelling"
    )  # ...when the cancel lands
    done = [{"tool_use_id": "c1", "content": '{"cancelled": true}'}]
    await fence.record_acted(ALICE.turn_id, 1, sideeffects.lines([CHECKED], done, SHOP.registry.is_serial))
    assert not await fence.claim_model_call(ALICE, 1, now=time.time())  # the turn is ending: the lease is let go
    await guard.sweeper.sweep(recorder.flag, now=time.time())
    await guard.outbox.drain()
    (ended,) = [m for _, m in recorder.sent if isinstance(m, TurnEnded)]
    assert ended.outcome is Outcome.CANCELLED and "I cancelled order ord_a1000003" in ended.text
    assert (await guard.ledger.get(ALICE.turn_id)).pending is None  # the reworded end went out and was cleared
