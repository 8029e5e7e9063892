"""Conversations: exchanges, the budget, the store (SQLite), and the guard's starts with history and ownership."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import pytest

from roundtrip._guard.conversations import Conversations, compact, estimate_tokens, exchange_of, within_budget
from roundtrip._guard.core import Guard
from roundtrip._guard.ledger import Ledger
from roundtrip._guard.replies import Replies
from roundtrip._guard.rules import Policy
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import ModelResponded, Outcome, StartTurn, ToolCall, Turn, Usage
from roundtrip._kernel.wire.fingerprints import fingerprint
from roundtrip._kernel.wire.limits import OMITTED_KEY
from tests.cores import guard as guard_of
from tests.databases import migrated
from tests.prices import price_table

PRICES = price_table()


def use(i: int, name: str = "list_orders") -> dict:
    return {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {}}


def result(i: int, content: str = '{"orders": []}') -> dict:
    return {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": content}


def paired(messages: list[dict]) -> bool:
    """Every tool_use is answered in the next message, and every tool_result answers the message before it."""
    for i, message in enumerate(messages):
        blocks = message["content"] if isinstance(message["content"], list) else []
        uses = {b["id"] for b in blocks if b.get("type") == "tool_use"}
        if uses:
            after = messages[i + 1]["content"] if i + 1 < len(messages) else []
            if uses - {b.get("tool_use_id") for b in after if isinstance(b, dict)}:
                return False
        answers = {b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"}
        if answers:
            before = messages[i - 1]["content"] if i else []
            if answers - {b.get("id") for b in before if isinstance(b, dict)}:
                return False
    return True


def alternates(messages: list[dict]) -> bool:
    return messages[0]["role"] == "user" and all(a["role"] != b["role"] for a, b in itertools.pairwise(messages))


# -- exchanges ------------------------------------------------------------------------------


def test_an_ended_turn_becomes_an_exchange_with_its_tool_pairs_and_final_words():
    turn = [
        {"role": "user", "content": "what orders do I have?"},
        {"role": "assistant", "content": [use(1)]},
        {"role": "user", "content": [result(1)]},
    ]
    exchange = exchange_of(turn, [{"type": "text", "text": "You have none."}], "You have none.")
    assert [m["role"] for m in exchange] == ["user", "assistant", "user", "assistant"]
    assert exchange[0]["content"] == [{"type": "text", "text": "what orders do I have?"}]
    assert exchange[-1]["content"] == [{"type": "text", "text": "You have none."}]
    assert paired(exchange) and alternates(exchange)


def test_a_stopped_turn_keeps_no_unanswered_call_and_ends_with_what_the_customer_was_told():
    turn = [
        {"role": "user", "content": "where is it?"},
        {"role": "assistant", "content": [use(1, "lookup_order")]},
        {"role": "user", "content": [{**result(1, "not found"), "is_error": True}]},
    ]
    stopped = [{"type": "text", "text": "Let me try again."}, use(2, "lookup_order")]  # the guard ended the turn here
    exchange = exchange_of(turn, stopped, "I'm sorry, I keep running into the same problem.")
    assert paired(exchange) and alternates(exchange)
    assert not any(b.get("id") == "toolu_2" for m in exchange for b in m["content"])
    assert exchange[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "I'm sorry, I keep running into the same problem."}],
    }
    # a refusal with no content at all
    refused = exchange_of([{"role": "user", "content": "x"}], [], "I'm sorry, but I can't help with that request.")
    assert [m["role"] for m in refused] == ["user", "assistant"]


def test_an_exchange_over_the_budget_is_compacted_without_losing_ids_or_pairs():
    big = "x" * 200_000
    exchange = exchange_of(
        [
            {"role": "user", "content": "list"},
            {"role": "assistant", "content": [use(1)]},
            {"role": "user", "content": [result(1, big)]},
        ],
        [{"type": "text", "text": "Here."}],
        "Here.",
    )
    small = compact(exchange, 1000)
    assert estimate_tokens(small) <= 1000 and paired(small)
    assert "removed from the history" in small[2]["content"][0]["content"]
    assert small[1]["content"][0]["id"] == "toolu_1" and small[2]["content"][0]["tool_use_id"] == "toolu_1"
    assert compact(exchange, 10**9) is exchange
    huge_input = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{**use(1), "input": {"q": big}}]},
        {"role": "user", "content": [result(1)]},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    ]
    assert OMITTED_KEY in compact(huge_input, 1000)[1]["content"][0]["input"]


def test_the_budget_keeps_the_newest_exchanges_that_fit():
    stored = [("t1", 400), ("t2", 300), ("t3", 500), ("t4", 200)]
    assert within_budget(stored, 999) == (["t3", "t4"], ["t1", "t2"])
    assert within_budget(stored, 1000) == (["t2", "t3", "t4"], ["t1"])
    assert within_budget(stored, 10_000) == (["t1", "t2", "t3", "t4"], [])
    assert within_budget(stored, 0) == ([], ["t1", "t2", "t3", "t4"])
    assert within_budget(stored, 100) == ([], ["t1", "t2", "t3", "t4"])  # never a part of an exchange


# -- the store ------------------------------------------------------------------------------


@pytest.fixture
async def store(tmp_path):
    s = await Conversations.open(
        await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"), budget_tokens=2000, retention_s=3600
    )
    yield s
    await s.close()


async def _turn(
    store: Conversations,
    conversation: str,
    turn_id: str,
    text: str,
    reply: str,
    payload: str = "{}",
    now: float | None = None,
) -> None:
    now = time.time() if now is None else now
    await store.open_turn(conversation, turn_id, text, now=now)
    messages = [
        {"role": "user", "content": text},
        {"role": "assistant", "content": [use(hash(turn_id) % 10**6)]},
        {"role": "user", "content": [result(hash(turn_id) % 10**6, payload)]},
    ]
    await store.close_turn(
        conversation, turn_id, messages, [{"type": "text", "text": reply}], reply, "end_turn", now=now
    )


async def test_a_conversation_belongs_to_whoever_started_it(store):
    assert (await store.claim("conv_a", "cus_1001", "", time.time())).owner == "cus_1001"
    assert (await store.claim("conv_a", "cus_1002", "", time.time())).owner == "cus_1001"
    assert (await store.claim("conv_a", "cus_1001", "", time.time())).owner == "cus_1001"


async def test_a_claim_says_whether_the_conversation_has_history(store):
    assert await store.claim("conv_h", "cus_1001", "", now=1000.0) == ("cus_1001", 0, "")  # new: nothing to read
    await _turn(store, "conv_h", "turn_h1", "hello", "hi", now=1000.0)
    # touched: its idle clock restarts
    assert await store.claim("conv_h", "cus_1001", "", now=1001.0) == ("cus_1001", 1, "")
    assert (await store.get("conv_h")).updated_at >= 1001.0
    assert await store.claim("conv_h", "cus_1002", "", now=1002.0) == (
        "cus_1001",
        1,
        "",
    )  # someone else's: refused, not touched
    assert (await store.get("conv_h")).updated_at < 1002.0


async def test_history_is_the_ended_turns_in_order_and_trimmed_to_the_budget(store):
    await store.claim("conv_b", "cus_1001", "", time.time())
    await store.open_turn("conv_b", "turn_running", "still running", time.time())
    assert await store.history("conv_b") == []  # a running turn is not history yet
    for n in range(6):
        await _turn(store, "conv_b", f"turn_{n}", f"question {n}", f"answer {n}", payload="y" * 1500, now=1000.0 + n)
    history = await store.history("conv_b")
    texts = [b["text"] for m in history for b in m["content"] if b.get("type") == "text"]
    assert texts[-2:] == ["question 5", "answer 5"] and "question 0" not in texts
    assert estimate_tokens(history) <= 2000 and paired(history) and alternates(history)
    row = await store.get("conv_b")
    assert row.turns == 6 and row.dropped_turns == 6 - row.history_turns and row.history_turns >= 2
    # a redelivered end stores the same exchange again and counts no second turn
    await _turn(store, "conv_b", "turn_5", "question 5", "answer 5", payload="y" * 1500, now=1005.0)
    assert (await store.get("conv_b")).turns == 6


async def test_forget_erases_and_a_running_turn_of_a_forgotten_conversation_saves_nothing(store):
    await store.claim("conv_c", "cus_1001", "", time.time())
    await _turn(store, "conv_c", "turn_c1", "hello", "hi")
    await store.open_turn("conv_c", "turn_c2", "and?", time.time())
    assert await store.forget("conv_c") is True
    assert await store.forget("conv_c") is False
    saved = await store.close_turn(
        "conv_c",
        "turn_c2",
        [{"role": "user", "content": "and?"}],
        [{"type": "text", "text": "ok"}],
        "ok",
        "end_turn",
        time.time(),
    )
    assert saved is False and await store.history("conv_c") == [] and await store.get("conv_c") is None
    assert (await store.claim("conv_c", "cus_1002", "", time.time())).owner == "cus_1002"  # erased: free again


async def test_conversations_idle_past_the_retention_expire(store):
    await store.claim("conv_old", "cus_1001", "", now=1000.0)
    await _turn(store, "conv_old", "turn_o1", "hello", "hi", now=1000.0)
    await store.claim("conv_new", "cus_1001", "", time.time())
    assert await store.expire() == 1
    assert [r.conversation_id for r in await store.list()] == ["conv_new"]
    # an expired conversation not swept yet is treated as gone when it is named again
    await store.claim("conv_old2", "cus_1001", "", now=1000.0)
    assert (await store.claim("conv_old2", "cus_1003", "", time.time())).owner == "cus_1003"


# -- the guard: history, ownership, one turn at a time ------------------------------------------


class Recorder:
    def __init__(self):
        self.sent: list[tuple[str, object]] = []

    async def __call__(self, topic, message, conversation_id):
        if topic != topics.SUPPORT_STATUS:  # the decisions; each step's progress (support.status) is not one
            self.sent.append((topic, message))


@pytest.fixture
async def guard(tmp_path):
    url = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    ledger = await Ledger.open(url)
    store = await Conversations.open(url, budget_tokens=20000)
    g = guard_of(
        ledger=ledger,
        policy=Policy(replies=Replies()),
        prices=PRICES,
        publish=Recorder(),
        model="claude-sonnet-4-6",
        conversations=store,
        wait_poll_s=0.05,
    )
    yield g
    await g.outbox.drain()
    await ledger.close()
    await store.close()


def turn(n: int, customer: str = "cus_1001", conversation: str = "conv_1") -> Turn:
    return Turn(
        turn_id=f"turn_{n}",
        request_id=f"req_{n}",
        conversation_id=conversation,
        customer_id=customer,
        trace_id="0" * 32,
    )


def responded(
    t: Turn, step: int, messages: list[dict], content: list[dict], stop_reason: str, calls=()
) -> ModelResponded:
    return ModelResponded(
        turn=t,
        step=step,
        messages=messages,
        content=content,
        stop_reason=stop_reason,
        tool_calls=list(calls),
        usage=Usage(input_tokens=10, output_tokens=5),
        spent=Usage(input_tokens=10 * step, output_tokens=5 * step),
        model="claude-sonnet-4-6",
    )


async def _run_turn(guard: Guard, t: Turn, text: str) -> list[dict]:
    """Start a turn, answer its first call with list_orders, its second with words; the first CallModel's messages."""
    await guard.starts.on_start(StartTurn(turn=t, text=text))
    topic, call = guard.outbox.publish.sent[-1]
    assert topic == topics.MODEL_CALLS
    started = call.turn
    list_call = ToolCall(
        id=f"toolu_{t.turn_id}", name="list_orders", input={}, fingerprint=fingerprint("list_orders", {})
    )
    await guard.loop.on_iteration(
        responded(started, 1, call.messages, [use(0) | {"id": list_call.id}], "tool_use", [list_call])
    )
    after = [
        *call.messages,
        {"role": "assistant", "content": [use(0) | {"id": list_call.id}]},
        {"role": "user", "content": [result(0) | {"tool_use_id": list_call.id}]},
    ]
    await guard.loop.on_iteration(
        responded(started, 2, after, [{"type": "text", "text": f"answer to {text}"}], "end_turn")
    )
    return call.messages


async def test_a_second_request_continues_from_the_first_turn(guard):
    first = await _run_turn(guard, turn(1), "what orders do I have?")
    assert first == [{"role": "user", "content": "what orders do I have?"}]
    second = await _run_turn(guard, turn(2), "cancel the second one")
    assert [m["role"] for m in second] == ["user", "assistant", "user", "assistant", "user"]
    assert second[-1] == {"role": "user", "content": "cancel the second one"}
    assert second[-2]["content"] == [{"type": "text", "text": "answer to what orders do I have?"}]
    assert paired(second)
    started = guard.outbox.publish.sent[-3][1]  # the second turn's first CallModel
    assert started.turn.history_messages == 4


async def test_the_loop_rules_count_only_this_turns_calls(guard):
    """list_orders three times in earlier turns is no repeat in this one."""
    for n in range(4):
        await _run_turn(guard, turn(n), f"question {n}")
    assert [m.outcome for _, m in guard.outbox.publish.sent if _ == topics.OUTCOMES] == [Outcome.END_TURN] * 4


async def test_another_customer_naming_the_conversation_is_refused_and_sees_nothing(guard):
    await _run_turn(guard, turn(1), "what orders do I have?")
    sent = len(guard.outbox.publish.sent)
    assert (
        await guard.starts.on_start(StartTurn(turn=turn(9, customer="cus_1002"), text="what did they ask?"))
        == "refused"
    )
    ((topic, ended),) = guard.outbox.publish.sent[sent:]
    assert topic == topics.OUTCOMES and ended.outcome is Outcome.CONVERSATION_REFUSED and ended.step == 0
    assert "another account" in ended.text and "ord_" not in ended.text and "orders" not in ended.text
    row = await guard.ledger.get("turn_9")
    assert row.status == "ended" and row.outcome == "conversation_refused"
    await guard.outbox.drain()
    assert (
        await guard.starts.on_start(StartTurn(turn=turn(9, customer="cus_1002"), text="what did they ask?"))
        == "duplicate"
    )
    assert len(await guard.conversations.history("conv_1")) == 4  # the owner's history is untouched


async def test_a_start_recorded_without_its_exchange_opens_it_when_redelivered(guard):
    """The turn's record and its exchange are written side by side: a start that failed after the record (the
    exchange not opened) opens it when the request is redelivered and its first call republished."""
    real_open, failed = guard.conversations.open_turn, []

    async def broken(*args, **kwargs):
        failed.append(args)
        raise ConnectionError("conversation store away")

    guard.conversations.open_turn = broken
    with pytest.raises(ConnectionError):
        await guard.starts.on_start(StartTurn(turn=turn(1), text="what orders do I have?"))
    assert failed and (await guard.ledger.get("turn_1")).step == 0  # recorded, its exchange not opened
    guard.conversations.open_turn = real_open
    assert await guard.starts.on_start(StartTurn(turn=turn(1), text="what orders do I have?")) == "republished"
    call = guard.outbox.publish.sent[-1][1]
    await guard.loop.on_iteration(
        responded(call.turn, 1, call.messages, [{"type": "text", "text": "You have two."}], "end_turn")
    )
    history = await guard.conversations.history("conv_1")
    assert history[0] == {"role": "user", "content": [{"type": "text", "text": "what orders do I have?"}]}


async def test_a_second_request_waits_for_the_running_turn_then_sees_it(guard):
    await guard.starts.on_start(StartTurn(turn=turn(1), text="what orders do I have?"))
    call = guard.outbox.publish.sent[-1][1]
    second = asyncio.create_task(guard.starts.on_start(StartTurn(turn=turn(2), text="and the second?")))
    await asyncio.sleep(0.2)  # the window the second start would have (wrongly) gone through in
    assert not second.done()  # waits: turn 1 is still running
    await guard.loop.on_iteration(
        responded(call.turn, 1, call.messages, [{"type": "text", "text": "You have two."}], "end_turn")
    )
    assert await asyncio.wait_for(second, 2) == "started"
    started = guard.outbox.publish.sent[-1][1]
    assert [m["role"] for m in started.messages] == ["user", "assistant", "user"]
    assert started.messages[1]["content"] == [{"type": "text", "text": "You have two."}]


async def test_a_turn_cancelled_from_outside_leaves_the_words_and_the_polite_reply(guard):
    await guard.starts.on_start(StartTurn(turn=turn(1), text="cancel everything"))
    row = await guard.ledger.get("turn_1")
    assert await guard.external_ends.end(row, Outcome.CANCELLED, "operator") == "ended"
    history = await guard.conversations.history("conv_1")
    assert history[0]["content"] == [{"type": "text", "text": "cancel everything"}]
    assert "stopped this request" in history[-1]["content"][0]["text"]
    assert json.dumps(history).count("tool_use") == 0
