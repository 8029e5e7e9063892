"""What `roundtrip ask` and `roundtrip trace` show in a terminal.

`ask` is a plain Kafka client like a user's app: it publishes a SupportRequest and
reads support.replies, and meanwhile follows the internal topics (without a consumer
group, from their ends) to show each step of the turn as it happens.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from rich.console import Console
from rich.table import Table

from services.kernel import topics
from services.kernel.events import CallModel, ExecuteToolBatch, ModelResponded, SupportReply, SupportRequest
from services.kernel.settings import Settings

console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _short(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def partitions_of(consumer: AIOKafkaConsumer, names) -> list[TopicPartition]:
    """Every partition of these topics, from one metadata request (for a consumer without a group)."""
    metadata = await consumer._client.fetch_all_metadata()
    return [TopicPartition(name, p) for name in names for p in metadata.partitions_for_topic(name) or ()]


async def ask(settings: Settings, text: str, customer: str, persona: str | None, conversation: str, timeout: float) -> int:
    request = SupportRequest(
        request_id=f"req_{int(time.time() * 1000)}", conversation_id=conversation, customer_id=customer, text=text, persona=persona
    )
    watched = {topics.t(n): n for n in (topics.ITERATIONS, topics.TOOL_BATCHES, topics.MODEL_CALLS, topics.SUPPORT_REPLIES)}
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, isolation_level="read_committed")
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    try:
        await consumer.start()
        partitions = await partitions_of(consumer, watched)
        if not partitions:
            console.print("[red]error:[/] the fleet's topics do not exist; is the fleet up? (roundtrip up)")
            return 2
        consumer.assign(partitions)
        await consumer.seek_to_end(*partitions)
        for tp in partitions:  # resolve positions now, so nothing published after this is missed
            await consumer.position(tp)
        await producer.start()
        await producer.send_and_wait(topics.t(topics.SUPPORT_REQUESTS), request.model_dump_json().encode(), key=conversation.encode())
        console.print(f"[bold]{customer}[/] asks: {text}" + (f"  [dim](persona {persona})[/]" if persona else ""))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    reply = _render(watched[record.topic], record.value, request.request_id)
                    if reply is not None:
                        colour = "green" if reply.outcome.value == "end_turn" else "yellow"
                        console.print(f"\n[bold]reply[/] ([{colour}]{reply.outcome.value}[/], {reply.steps} steps, "
                                      f"{reply.usage.input_tokens} in / {reply.usage.output_tokens} out tokens, "
                                      f"cache {reply.usage.cache_creation_input_tokens} written / {reply.usage.cache_read_input_tokens} read)")
                        console.print(reply.text)
                        console.print(f"[dim]turn {reply.turn_id}  trace {reply.trace_id}[/]")
                        return 0
        console.print(f"[red]no reply within {timeout:g} s[/] (see `roundtrip trace`, or the logs in {settings.state_dir / 'logs'})")
        return 1
    finally:
        await consumer.stop()
        await producer.stop()


def _render(topic: str, value: bytes, request_id: str) -> SupportReply | None:
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if topic == topics.SUPPORT_REPLIES:
        return SupportReply.model_validate(data) if data.get("request_id") == request_id else None
    if data.get("turn", {}).get("request_id") != request_id:
        return None
    if topic == topics.ITERATIONS:
        event = ModelResponded.model_validate(data)
        if event.error:
            console.print(f"[bold]step {event.step}[/] model call failed: [red]{event.error}[/]")
            return None
        console.print(f"[bold]step {event.step}[/] model → stop_reason [cyan]{event.stop_reason}[/]")
        for call in event.tool_calls:
            console.print(f"  calls {call.name}({_short(call.input)})")
    elif topic == topics.TOOL_BATCHES:
        batch = ExecuteToolBatch.model_validate(data)
        for call in batch.calls:
            verdict = "[green]approved[/]" if call.approved else f"[red]rejected[/]: {_short(call.error, 160)}"
            console.print(f"  gate  {call.name}: {verdict}")
    elif topic == topics.MODEL_CALLS:
        command = CallModel.model_validate(data)
        last = command.messages[-1] if command.messages else {}
        if command.step and isinstance(last.get("content"), list):
            for block in last["content"]:
                if block.get("type") == "tool_result":
                    mark = "[red]error[/]" if block.get("is_error") else "result"
                    console.print(f"  {mark} {_short(block.get('content'), 140)}")
    return None


def show_trace(settings: Settings, wanted: str) -> int:
    path = settings.effective_span_file
    if path is None or not path.exists():
        console.print(f"[red]no span file[/] at {path}; with ROUNDTRIP_OTLP_ENDPOINT set, look the trace up in Jaeger")
        return 1
    spans = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    trace_id = wanted
    if not any(s["trace_id"] == wanted for s in spans):
        trace_id = next((s["trace_id"] for s in spans if s["attributes"].get("roundtrip.turn_id") == wanted), "")
    mine = sorted((s for s in spans if s["trace_id"] == trace_id), key=lambda s: s["start_ns"])
    if not mine:
        console.print(f"[red]no spans[/] for {wanted} in {path}")
        return 1
    children: dict[str | None, list[dict]] = defaultdict(list)
    ids = {s["span_id"] for s in mine}
    for s in mine:
        children[s["parent_id"] if s["parent_id"] in ids else None].append(s)
    t0 = mine[0]["start_ns"]
    table = Table(title=f"trace {trace_id}", box=None, pad_edge=False)
    for column, justify in (("start ms", "right"), ("took ms", "right"), ("service", "left"), ("span", "left")):
        table.add_column(column, justify=justify)

    def add(span: dict, depth: int) -> None:
        took = (span["end_ns"] - span["start_ns"]) / 1e6
        name = ("  " * min(depth, 12)) + span["name"]
        if span["status"] == "ERROR":
            name += " [red]ERROR[/]"
        attrs = span["attributes"]
        extra = " ".join(f"{k.split('.')[-1]}={attrs[k]}" for k in ("roundtrip.decision", "roundtrip.outcome", "roundtrip.approved") if k in attrs)
        table.add_row(f"{(span['start_ns'] - t0) / 1e6:.1f}", f"{took:.1f}", span["service"].removeprefix("roundtrip-"), f"{name} [dim]{extra}[/]")
        for child in children.get(span["span_id"], []):
            add(child, depth + 1)

    for root in children[None]:
        add(root, 0)
    console.print(table)
    return 0


def _ledger_missing(settings: Settings) -> bool:
    """A SQLite ledger that does not exist means the wrong folder, not an empty fleet: say so, create nothing."""
    url = settings.ledger_db_url
    if url.startswith("sqlite") and not Path(url.split(":///", 1)[-1]).exists():
        console.print(f"[red]error:[/] no turn ledger at {url.split(':///', 1)[-1]}; run this where the fleet runs, "
                      "or set ROUNDTRIP_STATE_DIR / ROUNDTRIP_LEDGER_DATABASE_URL")
        return True
    return False


async def list_turns(settings: Settings, status: str | None, customer: str | None, limit: int) -> int:
    from services.guard.ledger import Ledger

    if _ledger_missing(settings):
        return 2
    ledger = await Ledger.open(settings.ledger_db_url)
    try:
        rows = await ledger.list(status=status, customer_id=customer, limit=limit)
    finally:
        await ledger.close()
    table = Table(box=None, pad_edge=False)
    for column in ("turn", "status", "customer", "step", "outcome", "cost $", "tokens in/out", "age s", "idle s", "trace id"):
        table.add_column(column)
    now = time.time()
    colours = {"running": "cyan", "stuck": "red", "ended": "dim"}
    for r in rows:
        idle = "" if r.status == "ended" else f"{now - r.last_progress_at:.0f}"
        table.add_row(
            r.turn_id, f"[{colours[r.status]}]{r.status}[/]", r.customer_id, str(r.step), r.outcome or "", f"{r.cost_usd:.4f}",
            f"{r.input_tokens + r.cache_creation_input_tokens + r.cache_read_input_tokens}/{r.output_tokens}",
            f"{now - r.started_at:.0f}", idle, r.trace_id,
        )
    console.print(table if rows else "no turns")
    return 0


async def cancel_turn(settings: Settings, turn_id: str, reason: str) -> int:
    from services.guard.ledger import ENDED, Ledger
    from services.kernel.events import CancelTurn

    if _ledger_missing(settings):
        return 2
    ledger = await Ledger.open(settings.ledger_db_url)
    try:
        row = await ledger.get(turn_id)
    finally:
        await ledger.close()
    if row is None:
        console.print(f"[red]no turn {turn_id}[/] in the ledger ({settings.ledger_db_url})")
        return 1
    if row.status == ENDED:
        console.print(f"turn {turn_id} already ended ({row.outcome})")
        return 0
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    try:
        await producer.start()
        command = CancelTurn(turn_id=turn_id, reason=reason)
        await producer.send_and_wait(topics.t(topics.TURN_CONTROLS), command.model_dump_json().encode(), key=row.conversation_id.encode())
    finally:
        await producer.stop()
    console.print(f"cancel sent for turn {turn_id} (customer {row.customer_id}); the guard ends it with a polite reply")
    return 0


async def show_dead_letters(settings: Settings, limit: int) -> int:
    from services.kernel.events import DeadLettered

    topic = topics.t(topics.DEAD_LETTERS)
    from services.kernel.admin import DEAD_LETTER_MAX_BYTES

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False,
                                max_partition_fetch_bytes=DEAD_LETTER_MAX_BYTES, fetch_max_bytes=2 * DEAD_LETTER_MAX_BYTES)
    try:
        await consumer.start()
        partitions = await partitions_of(consumer, [topic])
        if not partitions:
            console.print(f"[red]error:[/] no topic {topic}; is the fleet up? (roundtrip up)")
            return 2
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        for tp in partitions:
            consumer.seek(tp, max(0, ends[tp] - limit))
        letters = []

        async def behind() -> bool:
            return any([await consumer.position(tp) < ends[tp] for tp in partitions])

        while await behind():
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                letters.extend(records)
    finally:
        await consumer.stop()
    letters.sort(key=lambda r: r.timestamp)
    if not letters:
        console.print("no dead letters")
    for record in letters[-limit:]:
        letter = DeadLettered.model_validate_json(record.value)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.timestamp / 1000))
        console.print(f"[bold]{when}[/] {letter.service} could not process {letter.topic}"
                      f" (partition {letter.partition}, offset {letter.offset}, key {letter.key}): [red]{letter.reason}[/]")
        console.print(f"  {_short(letter.payload, 300)}")
    return 0


async def show_lag(settings: Settings, group: str | None, as_json: bool, watch: float | None) -> int:
    """Each consumer group's lag per topic and partition, its total, and its members; refreshed every `watch` s."""
    import asyncio

    from services.kernel.admin import consumer_lag

    while True:
        report = await consumer_lag(settings.bootstrap_servers, settings.topic_prefix, group)
        if as_json:
            print(json.dumps({"at": round(time.time(), 3), "bootstrap": settings.bootstrap_servers,
                              "groups": [g.as_dict() for g in report]}), flush=True)
        else:
            if watch:
                console.clear()
            _render_lag(report, settings)
        if not watch:
            return 0
        await asyncio.sleep(watch)


def _render_lag(report, settings: Settings) -> None:
    table = Table(box=None, pad_edge=False, title=f"consumer lag at {time.strftime('%H:%M:%S')} ({settings.bootstrap_servers})")
    for column, justify in (("group", "left"), ("state", "left"), ("topic", "left"), ("partition", "right"),
                            ("committed", "right"), ("end", "right"), ("lag", "right")):
        table.add_column(column, justify=justify)
    for g in report:
        state = g.state if g.state == "Stable" else f"[yellow]{g.state}[/]"
        for i, p in enumerate(g.partitions):
            committed = "-" if p.committed is None else str(p.committed)
            lag = f"[red]{p.lag}[/]" if p.lag else "0"
            table.add_row(g.group if i == 0 else "", state if i == 0 else "", p.topic, str(p.partition), committed, str(p.end), lag)
        total = f"[bold red]{g.lag}[/]" if g.lag else "[bold]0[/]"
        table.add_row("" if g.partitions else g.group, "" if g.partitions else state, "[bold]total[/]", "", "", "", total,
                      end_section=True)
    console.print(table)
    members = Table(box=None, pad_edge=False, title="members")
    for column in ("group", "client id", "host", "assigned partitions"):
        members.add_column(column)
    for g in report:
        for m in g.members:
            assigned = ", ".join(f"{t}[{n}]" for t, n in m.partitions) or "-"
            members.add_row(g.group, m.client_id, m.host, assigned)
        if not g.members:
            members.add_row(g.group, "[yellow](no members)[/]", "", "")
    console.print(members)
