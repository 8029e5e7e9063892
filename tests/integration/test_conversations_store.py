"""The conversation store on both databases it supports: a SQLite file and PostgreSQL."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

import pytest

from roundtrip._guard.conversations import Conversations, estimate_tokens
from roundtrip._guard.ledger import Ledger
from tests.databases import migrated
from tests.ledger_steps import advance


@pytest.fixture(params=["sqlite", "postgresql"])
async def url(request, tmp_path):
    return await migrated(
        f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("postgres_url")
    )


def _exchange(n: int, payload: str) -> tuple[list[dict], list[dict]]:
    messages = [
        {"role": "user", "content": f"question {n}"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": f"toolu_{n}", "name": "list_orders", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": payload}]},
    ]
    return messages, [{"type": "text", "text": f"answer {n}"}]


async def test_ownership_history_budget_erasure_and_expiry(url):
    store = await Conversations.open(url, budget_tokens=3000, retention_s=3600)
    ledger = await Ledger.open(url)  # the same database as the ledger by default: both schemas side by side
    conversation, now = f"conv_{uuid.uuid4().hex[:8]}", time.time()
    try:
        # two customers name a new conversation at the same moment: exactly one owns it
        owners = [
            c.owner
            for c in await asyncio.gather(
                *(store.claim(conversation, c, "", now) for c in ("cus_1001", "cus_1002", "cus_1001", "cus_1002"))
            )
        ]
        assert len(set(owners)) == 1
        owner = owners[0]
        for n in range(8):
            turn_id = f"turn_{conversation}_{n}"
            await store.open_turn(conversation, turn_id, f"question {n}", now=1000.0 + n)
            messages, final = _exchange(n, "z" * 4000)
            assert await store.close_turn(
                conversation, turn_id, messages, final, f"answer {n}", "end_turn", time.time()
            )
        history = await store.history(conversation)
        assert (
            estimate_tokens(history) <= 3000
            and history[0]["role"] == "user"
            and history[-1]["content"][0]["text"] == "answer 7"
        )
        uses = [b["id"] for m in history for b in m["content"] if b.get("type") == "tool_use"]
        results = [b["tool_use_id"] for m in history for b in m["content"] if b.get("type") == "tool_result"]
        assert uses == results and uses[-1] == "toolu_7"
        row = await store.get(conversation)
        assert row.customer_id == owner and row.turns == 8 and row.dropped_turns == 8 - row.history_turns
        # a redelivered end stores the same again and counts no second turn; a turn never opened stores nothing
        assert await store.close_turn(conversation, turn_id, messages, final, "answer 7", "end_turn", time.time())
        assert not await store.close_turn(
            conversation, "turn_never_opened", messages, final, "answer", "end_turn", time.time()
        )
        again = await store.get(conversation)
        assert (again.turns, again.history_turns) == (8, row.history_turns) and (
            await store.claim(conversation, owner, "", time.time())
        ).stored_turns == 8
        assert conversation in {r.conversation_id for r in await store.list(customer_id=owner)}
        assert (
            await store.forget(conversation)
            and await store.history(conversation) == []
            and await store.get(conversation) is None
        )
        await store.claim(conversation, "cus_1003", "", now=1.0)
        assert await store.expire() >= 1 and await store.get(conversation) is None
    finally:
        await store.close()
        await ledger.close()


async def test_an_ends_exchange_is_written_in_the_transaction_of_the_ledgers_end_or_not_at_all(url):
    """Both stores in one database: the end and its history together; an end the ledger refuses writes nothing."""
    store, ledger = await Conversations.open(url), await Ledger.open(url)
    assert store.shares(ledger)
    conversation = f"conv_{uuid.uuid4().hex[:8]}"
    turn = {
        "turn_id": f"turn_{uuid.uuid4().hex[:8]}",
        "request_id": "r",
        "conversation_id": conversation,
        "customer_id": "cus_1001",
    }
    principal = SimpleNamespace(**turn)
    pending = '{"topic": "turn.outcomes", "message": {"text": "answer 1"}}'
    try:
        await store.claim(conversation, "cus_1001", "", time.time())
        await store.open_turn(conversation, turn["turn_id"], "question 1", time.time())
        await ledger.start(turn, pending="{}")
        messages, final = _exchange(1, "x")

        def closing():
            return store.closing(conversation, turn["turn_id"], messages, final, "answer 1", "end_turn", time.time())

        def failing(conn):
            closing()(conn)
            raise RuntimeError("the history write failed")

        with pytest.raises(RuntimeError):  # the end is rolled back with its history: the turn still runs
            await advance(ledger, principal, 1, {}, 0.0, pending, outcome="end_turn", then=failing, now=time.time())
        assert (await ledger.get(turn["turn_id"])).status == "running"
        assert await store.exchange(turn["turn_id"]) is None
        assert await advance(
            ledger, principal, 1, {}, 0.0, pending, outcome="end_turn", then=closing(), now=time.time()
        )
        assert (await ledger.get(turn["turn_id"])).status == "ended" and await store.exchange(turn["turn_id"])
        before = await store.history(conversation)

        def forged(conn):
            return store.closing(conversation, turn["turn_id"], messages, final, "injected", "end_turn", time.time())(
                conn
            )

        assert not await advance(
            ledger, principal, 1, {}, 0.0, pending, outcome="end_turn", then=forged, now=time.time()
        )
        assert await store.history(conversation) == before
    finally:
        await ledger.close()
        await store.close()
