"""What customers, models, tools and people write is printed as text in every CLI view: `[red]49,99[/red]` shows as
typed (never as colour), `[[tx:echo]]` as is, `:smile:` stays a word; the approvals table keeps every column at any
label length."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

from rich.console import Console
from typer.testing import CliRunner

from roundtrip._cli import approvals, common, following
from roundtrip._cli.main import app
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import (
    CheckedCall,
    ExecuteToolBatch,
    ModelResponded,
    Outcome,
    SupportReply,
    ToolCall,
    Turn,
    Usage,
)
from tests.approval_rows import list_these_approvals, pending_approval

MARKUP = "[red]49,99[/red] [[tx:echo]] :smile: [bold]"  # colour, a double bracket, an emoji code, an unclosed tag
TURN = Turn(turn_id="turn_1", request_id="req_1", conversation_id="conv_1", customer_id="cus_1001", trace_id="ab" * 16)


class Producer:
    def __init__(self, sent: list[dict]) -> None:
        self.sent = sent

    async def send_and_wait(self, topic, value, key=None):
        self.sent.append(json.loads(value))

    async def stop(self):
        pass


class Consumer:
    """Answers the request the producer sent, as the fleet would: a step whose call carries markup, then the reply."""

    def __init__(self, sent: list[dict], prefix: str) -> None:
        self.sent, self.prefix, self.done = sent, prefix, False

    async def getmany(self, timeout_ms=0):
        if self.done or not self.sent:
            return {}
        self.done, request = True, self.sent[0]
        turn = TURN.model_copy(
            update={"request_id": request["request_id"], "conversation_id": request["conversation_id"]}
        )
        step = ModelResponded(
            turn=turn,
            step=1,
            messages=[],
            stop_reason="tool_use",
            tool_calls=[ToolCall(id="toolu_1", name="lookup_order", input={"note": MARKUP}, fingerprint="f")],
        )
        reply = SupportReply(
            request_id=request["request_id"],
            conversation_id=request["conversation_id"],
            customer_id=request["customer_id"],
            turn_id="turn_1",
            text=f"It costs {MARKUP}",
            outcome=Outcome.END_TURN,
            steps=1,
            usage=Usage(),
            cost_usd=0.0,
            trace_id="ab" * 16,
        )
        records = [
            SimpleNamespace(topic=self.prefix + name, value=message.model_dump_json().encode())
            for name, message in ((topics.ITERATIONS, step), (topics.SUPPORT_REPLIES, reply))
        ]
        return {"tp": records}

    async def stop(self):
        pass


def test_ask_shows_the_customers_and_the_models_text_as_typed(monkeypatch):
    async def start(session) -> bool:
        sent: list[dict] = []
        session.producer, session.consumer = Producer(sent), Consumer(sent, session.settings.topic_prefix)
        return True

    monkeypatch.setattr(following.Session, "start", start)
    monkeypatch.setattr(following.Session, "stop", Producer.stop)
    monkeypatch.setattr(
        following, "console", Console(file=(out := io.StringIO()), width=300, highlight=False, emoji=False)
    )
    result = CliRunner().invoke(app, ["ask", f"is it {MARKUP}?", "--customer", "[red]x[/red]"])
    assert result.exit_code == 0, result.output
    shown = out.getvalue()
    assert f"[red]x[/red] asks: is it {MARKUP}?" in shown  # the customer's line
    assert f'calls lookup_order({{"note": "{MARKUP}"}})' in shown  # the model's call
    assert f"It costs {MARKUP}" in shown  # the reply


def test_every_line_of_a_turn_shows_tool_and_gate_text_as_typed(capsys):
    batch = ExecuteToolBatch(
        turn=TURN,
        step=1,
        messages=[],
        calls=[CheckedCall(id="toolu_1", name="lookup_order", input={}, approved=False, error=f"no order {MARKUP}")],
    )
    following._render(topics.TOOL_BATCHES, batch.model_dump(mode="json"), "req_1", {}, set())
    results = {
        "turn": TURN.model_dump(),
        "step": 2,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": f"found {MARKUP}"}],
            }
        ],
    }
    following._render(topics.MODEL_CALLS, results, "req_1", {}, set())
    out = capsys.readouterr().out
    assert f"rejected: no order {MARKUP}" in out and f"result found {MARKUP}" in out


async def test_the_approvals_table_keeps_every_column_at_any_label_length(tmp_path, monkeypatch):
    from roundtrip._kernel.settings import Settings

    # an MCP tool whose input names no *_id: its label is the tool's name and the input in short
    row = pending_approval(
        TURN,
        "knowledge_base_search_articles_for_the_customer_in_every_language",
        {"query": "how do I return a parcel that came damaged " * 4, "note": MARKUP},
        f"refunds need a person {MARKUP}",
    )
    list_these_approvals(monkeypatch, [row])
    (tmp_path / "ledger.db").touch()
    for width in (80, 200):
        monkeypatch.setattr(
            common, "console", Console(file=(out := io.StringIO()), width=width, highlight=False, emoji=False)
        )
        assert (
            await approvals.list_approvals(Settings(_env_file=None, state_dir=tmp_path), everything=False, limit=10)
            == 0
        )
        header, first = out.getvalue().splitlines()[:2]
        assert header.split() == [word for column in approvals.APPROVAL_COLUMNS for word in column.split()], (
            width,
            header,
        )
        assert common.call_label(row.tool, json.loads(row.request_json)["call"]["input"]) in first
        assert row.approval_id in first and TURN.trace_id in first
        assert (
            "refunds need" in first and "[red]49,99[/red]" in out.getvalue()
        )  # the reason: its column is there, as typed
