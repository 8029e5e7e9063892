"""The batch lane in the guard and the operator's view (issue 55): a call a Message Batch answered is priced at the
batch rate and a batch turn's calls each at their own; a batch turn waiting for its batch is never flagged stuck and
ends at its own deadline; `roundtrip turns` and the console show `in batch msgbatch_...` (or `waiting for a batch`).
The guard's core runs over a real (SQLite) ledger with a recording publisher in place of Kafka."""

from __future__ import annotations

import re
import time

import pytest

from roundtrip._cli import turns as turns_cli
from roundtrip._console import pages
from roundtrip._console.ledger_reader import Books
from roundtrip._guard.ledger import ENDED, RUNNING, STUCK
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.prices import Price
from roundtrip._kernel.storage.turnstore import CALL_IN_BATCH, CALL_QUEUED, Fence, batch_calls
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import ModelResponded, Outcome, StartTurn, Turn, Usage
from tests.prices import price_table
from tests.unit.test_guard_handlers import LIST, PRICES, guard  # noqa: F401 - fixture

SONNET = "claude-sonnet-4-6"  # list price, USD per million tokens: 3.00 in, 15.00 out, 3.75 cache write, 0.30 read
CALL = Usage(input_tokens=1000, output_tokens=200)  # $0.0060 direct, $0.0030 in a batch


def _turn(name: str, lane: str, deadline_at: float = 0.0) -> Turn:
    return Turn(
        turn_id=f"turn_{name}",
        request_id=f"req_{name}",
        conversation_id=f"conv_{name}",
        customer_id="cus_1001",
        trace_id="0" * 32,
        lane=lane,
        deadline_at=deadline_at,
    )


def _answer(turn: Turn, step: int, batch_id: str, end: bool = False) -> ModelResponded:
    return ModelResponded(
        turn=turn,
        step=step,
        messages=[{"role": "user", "content": "hi"}],
        content=[{"type": "text", "text": "Done."}]
        if end
        else [{"type": "tool_use", "id": LIST.id, "name": LIST.name, "input": {}}],
        stop_reason="end_turn" if end else "tool_use",
        tool_calls=[] if end else [LIST],
        usage=CALL,
        spent=Usage(input_tokens=CALL.input_tokens * step, output_tokens=CALL.output_tokens * step),
        model=SONNET,
        batch_id=batch_id,
    )


# -- the price of a batch call -------------------------------------------------------------------


def test_a_batch_call_costs_half_of_every_kind_of_token():
    usage = Usage(
        input_tokens=1000, output_tokens=200, cache_creation_input_tokens=4000, cache_read_input_tokens=10_000
    )
    # 1,000 x 3.00 + 200 x 15.00 + 4,000 x 3.75 + 10,000 x 0.30 per million = 0.003 + 0.003 + 0.015 + 0.003
    assert PRICES.cost(SONNET, usage) == pytest.approx(0.024)
    assert PRICES.cost(SONNET, usage, batch=True) == pytest.approx(0.012)
    assert PRICES.batch_price("claude-haiku-4-5-20251001") == Price(0.5, 2.5, 0.625, 0.05)  # half its list price


def test_a_batch_rate_in_the_price_table_wins_over_half_by_id_or_family():
    table = price_table(
        '{"default": [2.0, 10.0, 2.5, 0.2], "my-model": [4.0, 20.0, 5.0, 0.4], "batch:claude-sonnet-4": [1, 6, 2, 0.1]}'
    )
    assert table.batch_price(SONNET) == Price(1.0, 6.0, 2.0, 0.1)  # negotiated, by family
    assert table.price(SONNET) == Price(3.0, 15.0, 3.75, 0.30)  # its direct price untouched (the list's)
    assert table.batch_price("my-model") == Price(2.0, 10.0, 2.5, 0.2)  # half the configured price
    assert table.batch_price("unlisted") == Price(1.0, 5.0, 1.25, 0.1)  # half the default


async def test_a_turn_half_batch_half_direct_is_priced_call_by_call_in_its_reply_and_the_ledger(guard):  # noqa: F811
    mixed, chat = _turn("mixed", "batch", time.time() + 86_400), _turn("chat", "interactive")
    for turn in (mixed, chat):
        assert await guard.starts.on_start(StartTurn(turn=turn, text="hi")) == "started"
    assert await guard.loop.on_iteration(_answer(mixed, 1, "msgbatch_01")) == "CheckToolCalls"
    assert (await guard.ledger.get(mixed.turn_id)).cost_usd == pytest.approx(0.003)  # the batch call at half
    assert await guard.loop.on_iteration(_answer(mixed, 2, "", end=True)) == "end_turn"  # retried directly
    assert await guard.loop.on_iteration(_answer(chat, 1, "")) == "CheckToolCalls"
    assert await guard.loop.on_iteration(_answer(chat, 2, "", end=True)) == "end_turn"
    await guard.outbox.drain()
    replies = {m.turn.turn_id: m for t, m in guard.recorder.sent if t == topics.OUTCOMES}
    assert replies[mixed.turn_id].cost_usd == pytest.approx(0.003 + 0.006)
    assert replies[chat.turn_id].cost_usd == pytest.approx(0.006 + 0.006)
    assert (await guard.ledger.get(mixed.turn_id)).cost_usd == pytest.approx(0.009)
    assert (await guard.ledger.get(chat.turn_id)).cost_usd == pytest.approx(0.012)


# -- the stuck rule and the deadline -------------------------------------------------------------


async def test_a_batch_turn_in_its_batch_is_never_stuck_and_ends_at_its_own_deadline(guard, tmp_path):  # noqa: F811
    t0 = time.time()
    waiting = _turn("waiting", "batch", round(t0 + 86_400, 3))  # the deadline the gateway gives a batch turn
    tools = _turn("tools", "batch", round(t0 + 86_400, 3))
    chat = _turn("chat", "interactive", round(t0 + 86_400, 3))  # a chat turn's deadline is the guard's own
    for turn in (waiting, tools, chat):
        await guard.starts.on_start(StartTurn(turn=turn, text="hi"))
    for turn in (waiting, tools):
        await guard.loop.on_iteration(_answer(turn, 1, "msgbatch_01"))
    fence = await Fence.open(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")  # the guard fixture's ledger
    try:
        for turn in (waiting, tools):  # the executor runs each step's tools ...
            assert await fence.claim_batch(turn, 1, lease_s=3600, now=time.time())
        assert await fence.claim_model_call(waiting, 1, time.time())  # ... one's are done: its next call: a batch
    finally:
        await fence.close()
    rows = {t.turn_id: await guard.ledger.get(t.turn_id) for t in (waiting, tools, chat)}
    assert rows[waiting.turn_id].deadline_at == pytest.approx(t0 + 86_400)
    assert rows[chat.turn_id].deadline_at == pytest.approx(t0 + 300, abs=5)
    assert [r.shown_status for r in rows.values()] == ["in batch", RUNNING, RUNNING]

    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 120) == (2, 0)
    assert {f.turn.turn_id for f in guard.recorder.flags} == {tools.turn_id, chat.turn_id}  # tools hang: stuck
    assert (await guard.ledger.get(tools.turn_id)).status == STUCK
    assert (await guard.ledger.get(waiting.turn_id)).status == RUNNING
    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 3600) == (0, 1)  # the chat turn, at 300 s
    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 80_000) == (0, 0)  # hours in a batch: fine
    assert (await guard.ledger.get(waiting.turn_id)).flagged_at is None
    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 86_401) == (0, 1)
    ended = await guard.ledger.get(waiting.turn_id)
    assert (ended.status, ended.outcome, ended.flagged_at) == (ENDED, Outcome.DEADLINE.value, None)
    await guard.outbox.drain()
    (end,) = [m for t, m in guard.recorder.sent if t == topics.OUTCOMES and m.turn.turn_id == waiting.turn_id]
    assert end.outcome is Outcome.DEADLINE and "sorry" in end.text.lower()


# -- what the operator sees ----------------------------------------------------------------------


async def test_the_cli_and_the_console_show_the_batch_a_batch_turn_waits_in(guard, tmp_path, capsys):  # noqa: F811
    deadline = time.time() + 86_400
    waiting, gathered = _turn("waiting", "batch", deadline), _turn("gathered", "batch", deadline)
    chat = _turn("chat", "interactive")
    for turn in (waiting, gathered, chat):
        await guard.starts.on_start(StartTurn(turn=turn, text="hi"))
    call = dict(step=0, grouping="", queued_at=time.time(), command_json="{}")
    calls = [  # the model service's record: one call in a submitted batch, one gathered for the next batch
        {**call, "turn_id": waiting.turn_id, "custom_id": "w_0", "status": CALL_IN_BATCH, "batch_id": "msgbatch_01"},
        {**call, "turn_id": gathered.turn_id, "custom_id": "g_0", "status": CALL_QUEUED, "batch_id": None},
    ]
    await guard.ledger._run(lambda conn: conn.execute(batch_calls.insert(), calls), write=True)
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"  # the guard fixture's ledger
    settings = Settings(_env_file=None, state_dir=tmp_path, ledger_database_url=url)

    assert await turns_cli.list_turns(settings, None, None, 30, "batch", None) == 0
    listed = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # colours, where the terminal is forced
    (line,) = [row for row in listed.splitlines() if waiting.turn_id in row]
    assert " in batch msgbatch_01 " in line
    (line,) = [row for row in listed.splitlines() if gathered.turn_id in row]
    assert " waiting for a batch " in line
    assert chat.turn_id not in listed
    assert await turns_cli.list_turns(settings, None, None, 30, "interactive", None) == 0
    listed = capsys.readouterr().out
    assert chat.turn_id in listed and waiting.turn_id not in listed

    books = Books(url, url)  # what the console reads
    try:
        table = pages.turns_table(await books.turns(None, None, None, None), "v", None, time.time())
        row, _ = await books.turn(waiting.turn_id)
    finally:
        await books.close()
    cells = table.split(f'<tr data-turn="{waiting.turn_id}">', 1)[1].split("</tr>", 1)[0]
    assert '<td class="status st-running">in batch msgbatch_01</td><td class="lane">batch</td>' in cells
    cells = table.split(f'<tr data-turn="{gathered.turn_id}">', 1)[1].split("</tr>", 1)[0]
    assert '<td class="status st-running">waiting for a batch</td>' in cells
    summary = pages.turn_summary(row, None, time.time())
    assert '<th>status</th><td><span class="status st-running">in batch msgbatch_01</span></td>' in summary
    plain_row = await guard.ledger.get(waiting.turn_id)  # the guard's own reads do not ask the model's table
    assert plain_row.shown_status == "in batch"
