"""What `roundtrip ask`, `chat` and `trace` show in a terminal.

`ask` is a plain Kafka client like a user's app: it publishes a SupportRequest and
reads support.replies, and meanwhile follows the internal topics (without a consumer
group, from their ends) to show each step of the turn as it happens. `chat` does the same
for each line typed, all in one conversation (the guard keeps its history).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.measure import Measurement
from rich.segment import Segments
from rich.table import Table
from rich.text import Text

from roundtrip._cli.live_order import StepOrder
from roundtrip._kernel.database import shown
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.kafka.clients import kafka_clients
from roundtrip._kernel.observability import traces
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import (
    ApprovalDecided,
    ApprovalRequested,
    CallModel,
    DeadLettered,
    DeadLetterHandled,
    ExecuteToolBatch,
    ModelResponded,
    Outcome,
    StreamedText,
    SupportReply,
    SupportRequest,
    SupportStatus,
    TurnFlagged,
    TurnState,
)

if TYPE_CHECKING:  # imported where used, for the start-up time of the CLI
    from roundtrip._kernel.kafka.admin import GroupLag
    from roundtrip._kernel.kafka.dead_letters import Letter
    from roundtrip._kernel.storage.ledger_reads import ApprovalRow

# emoji off: a customer's ":smile:" stays as typed; the markup is the fleet's, the values go through plain()
console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 200)


def plain(value: Any) -> str:
    """`value` shown as it is inside a line of markup: text from customers, models, tools and people
    (`[red]49,99[/red]`, `[[tx:echo]]`) is never read as Rich markup."""
    return escape(str(value))


def _short(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_label(name: str, tool_input: Any) -> str:
    """`cancel_order(ord_a1000003)`: the ids a call names, else its input in short."""
    ids = [str(v) for k, v in tool_input.items() if k.endswith("_id")] if isinstance(tool_input, dict) else []
    return f"{name}({', '.join(ids) if ids else _short(tool_input, 60)})"


class Session:
    """A producer of support requests and a reader (no consumer group) of the turn's topics."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.watched = {
            topics.t(n, settings.topic_prefix): n
            for n in (
                topics.ITERATIONS,
                topics.TOOL_CALLS,
                topics.TOOL_BATCHES,
                topics.MODEL_CALLS,
                topics.TURN_EVENTS,
                topics.SUPPORT_REPLIES,
                topics.APPROVAL_REQUESTS,
                topics.APPROVAL_DECISIONS,
                topics.SUPPORT_STATUS,
                topics.SUPPORT_STREAM,
            )
        }
        kafka = kafka_clients(settings)
        self.consumer = kafka.consumer(enable_auto_commit=False, isolation_level="read_committed")
        self.producer = kafka.producer()

    async def start(self) -> bool:
        await self.consumer.start()
        partitions = await partitions_of(self.consumer, self.watched)
        if not partitions:
            console.print("[red]error:[/] the fleet's topics do not exist; is the fleet up? (roundtrip up)")
            return False
        self.consumer.assign(partitions)
        await self.consumer.seek_to_end(*partitions)
        for tp in partitions:  # resolve positions now, so nothing published after this is missed
            await self.consumer.position(tp)
        await self.producer.start()
        return True

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.producer.stop()

    async def ask(
        self,
        text: str,
        customer: str,
        persona: str | None,
        conversation: str,
        timeout: float,
        stream: bool | None = None,
    ) -> int:
        """Publish one request, show each step of its turn (and its text as it streams, when it does), then the
        reply; its exit code (`exit_code`), 1 on timeout."""
        request = SupportRequest(
            request_id=f"req_{int(time.time() * 1000)}",
            conversation_id=conversation,
            customer_id=customer,
            text=text,
            persona=persona,
            stream=stream,
        )
        await self.producer.send_and_wait(
            topics.t(topics.SUPPORT_REQUESTS, self.settings.topic_prefix),
            request.model_dump_json().encode(),
            key=conversation.encode(),
        )
        console.print(
            f"[bold]{plain(customer)}[/] asks: {plain(text)}"
            + (f"  [dim](persona {plain(persona)})[/]" if persona else "")
        )
        seen: dict[str, str | None] = {"last": None}  # the last hop of the turn seen: where it waits when it is stuck
        waiting: set[str] = set()  # approval ids of this turn
        order = StepOrder(request.request_id)  # what Kafka's fetches return, in the order it happened
        streamed = TextShown(request.request_id)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for records in (await self.consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    with contextlib.suppress(ValueError):
                        name, data = self.watched[record.topic], json.loads(record.value)
                        if name == topics.SUPPORT_STREAM:  # shown as it comes, not held
                            streamed.show(data)
                        elif stream or not (name == topics.SUPPORT_STATUS and data.get("state") == "working"):
                            order.add(name, data)  # each step's progress beside its streamed text (--stream)
            for topic, data in order.ready():
                if topic == topics.SUPPORT_STATUS and data.get("until"):  # a wait for a person: ask waits as long
                    deadline = max(deadline, time.monotonic() + max(0.0, data.get("until", 0) - time.time()) + timeout)
                reply = _render(topic, data, request.request_id, seen, waiting)
                if reply is not None:
                    return show_reply(reply)
        console.print(
            f"[red]no reply within {timeout:g} s[/] (see `roundtrip trace`, or the logs in "
            f"{self.settings.state_dir / 'logs'})"
        )
        return 1


class TextShown:
    """The text of a turn that streams (support.stream), written to the terminal as it comes: each chunk once, a
    stream's end closes its line, a cut says its text is discarded (the reply that follows is the answer)."""

    def __init__(self, request_id: str) -> None:
        self.request_id, self.open = request_id, ""
        self.seen: set[tuple[int, str, int, bool]] = set()

    def show(self, data: dict[str, Any]) -> None:
        if data.get("request_id") != self.request_id:
            return
        chunk = StreamedText.model_validate(data)
        key = (chunk.step, chunk.stream_id, chunk.sequence, chunk.cut)
        if key in self.seen:
            return
        self.seen.add(key)
        if chunk.cut:
            if self.open:
                console.print()
                console.print("  [dim](the text above was cut: discarded)[/]")
            self.open = ""
            return
        if chunk.text:
            if self.open != chunk.stream_id:
                console.print("  [cyan]»[/] ", end="")
            console.print(plain(chunk.text), end="", soft_wrap=True, highlight=False)
            self.open = chunk.stream_id
        if chunk.final and self.open:
            console.print()
            self.open = ""


# `roundtrip ask`'s exit code by the reply's outcome; 1: no reply, 2: not asked
EXIT_CODES = {
    **dict.fromkeys(
        (
            Outcome.STEP_LIMIT,
            Outcome.REPEATED_CALL,
            Outcome.CYCLE,
            Outcome.FAILURE_STREAK,
            Outcome.BUDGET,
            Outcome.DEADLINE,
            Outcome.CANCELLED,
            Outcome.APPROVAL_TIMEOUT,
        ),
        3,
    ),  # the guard stopped the turn
    **dict.fromkeys(
        (
            Outcome.MAX_TOKENS,
            Outcome.STOP_SEQUENCE,
            Outcome.REFUSAL,
            Outcome.CONTEXT_WINDOW_EXCEEDED,
            Outcome.UNKNOWN_STOP_REASON,
        ),
        4,
    ),  # the model stopped without its answer
    Outcome.MODEL_ERROR: 5,
    Outcome.MODEL_BUSY: 5,
    Outcome.CONVERSATION_REFUSED: 6,
    Outcome.INVALID_REQUEST: 6,  # the request was refused
    Outcome.END_TURN: 0,
}


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def show_reply(reply: SupportReply) -> int:
    """Print a turn's reply; the exit code of its outcome (EXIT_CODES), with a line saying why when not 0."""
    colour = "green" if reply.outcome is Outcome.END_TURN else "yellow"
    console.print(
        f"\n[bold]reply[/] ([{colour}]{reply.outcome.value}[/], {plural(reply.steps, 'step')}, "
        f"{reply.usage.input_tokens} in / {reply.usage.output_tokens} out tokens, "
        f"cache {reply.usage.cache_creation_input_tokens} written / {reply.usage.cache_read_input_tokens} read)"
    )
    console.print(Text(reply.text))
    if reply.reason:
        console.print(f"[yellow]refused:[/] {plain(reply.reason)}")
    console.print(f"[dim]turn {reply.turn_id or '(none)'}  trace {reply.trace_id}[/]")
    code = EXIT_CODES[reply.outcome]
    if code:
        console.print(
            f"[yellow]the turn did not end with the model's answer: {reply.outcome.value} (exit code {code})[/]"
        )
    return code


async def ask(
    settings: Settings,
    text: str,
    customer: str,
    persona: str | None,
    conversation: str,
    timeout: float,
    stream: bool | None = None,
) -> int:
    session = Session(settings)
    try:
        if not await session.start():
            return 2
        return await session.ask(text, customer, persona, conversation, timeout, stream)
    finally:
        await session.stop()


async def chat(settings: Settings, customer: str, persona: str | None, conversation: str, timeout: float) -> int:
    """One conversation in the terminal: each line typed is the next request (an empty line or EOF ends it)."""
    import asyncio

    session = Session(settings)
    try:
        if not await session.start():
            return 2
        console.print(
            f"[dim]conversation {plain(conversation)} as {plain(customer)}; an empty line or Ctrl-D ends it[/]"
        )
        while True:
            try:
                text = (await asyncio.to_thread(input, "> ")).strip()
            except (EOFError, KeyboardInterrupt):
                break
            if not text:
                break
            await session.ask(text, customer, persona, conversation, timeout)
            console.print()
        console.print(
            f"[dim]resume it with: roundtrip chat --customer {plain(customer)} --conversation {plain(conversation)}[/]"
        )
        return 0
    finally:
        await session.stop()


# where a turn waits, by the last hop of it that was published (the one whose consumer has not answered)
WAITING_ON = {
    None: "the gateway or the guard (support.requests, turn.starts)",
    topics.MODEL_CALLS: "the model service (turn.model_calls)",
    topics.ITERATIONS: "the guard (turn.iterations)",
    topics.TOOL_CALLS: "the gate (turn.tool_calls)",
    topics.TOOL_BATCHES: "an executor (turn.tool_batches)",
}


def _show_status(data: dict[str, Any]) -> None:
    """What the app is told while its turn waits (support.status)."""
    status = SupportStatus.model_validate(data)
    if status.state == TurnState.WORKING:
        console.print(
            f"  [dim]working on step {status.step}[/]" + (f": {plain(status.activity)}" if status.activity else "")
        )
        return
    console.print(
        f"  [yellow]{status.state.value}[/] until {time.strftime('%H:%M:%S', time.localtime(status.until))} "
        "(support.status): the reply comes once a person decides, or then"
    )


def _render(
    topic: str,
    data: dict[str, Any],
    request_id: str,
    seen: dict[str, str | None] | None = None,
    waiting: set[str] | None = None,
) -> SupportReply | None:
    seen = {} if seen is None else seen
    waiting = set() if waiting is None else waiting
    if topic == topics.SUPPORT_REPLIES:
        return SupportReply.model_validate(data) if data.get("request_id") == request_id else None
    if topic == topics.SUPPORT_STATUS:
        if data.get("request_id") == request_id:
            _show_status(data)
        return None
    if topic == topics.APPROVAL_DECISIONS:
        if data.get("approval_id") in waiting:
            decision = ApprovalDecided.model_validate(data)
            verdict = "[green]approved[/]" if decision.decision.value == "approve" else "[red]denied[/]"
            console.print(
                f"  {verdict} by {plain(decision.decided_by)}"
                + (f": {plain(decision.reason)}" if decision.reason else "")
            )
        return None
    if data.get("turn", {}).get("request_id") != request_id:
        return None
    if topic == topics.TURN_EVENTS:
        flagged = TurnFlagged.model_validate(data)
        console.print(f"[bold red]turn {flagged.turn.turn_id} is {flagged.status}[/]: {plain(flagged.detail)}")
        console.print(
            f"  waiting on {WAITING_ON.get(seen.get('last'), seen.get('last'))} since step {flagged.step}; "
            f"trace {flagged.turn.trace_id}"
        )
        return None
    seen["last"] = topic
    _show_step(topic, data, waiting)
    return None


def _show_step(topic: str, data: dict[str, Any], waiting: set[str]) -> None:
    """One line (or a few) for a hop of a turn's step: the model's answer, the gate's verdicts, an approval asked
    for, the results sent back to the model."""
    if topic == topics.ITERATIONS:
        event = ModelResponded.model_validate(data)
        if event.error:
            console.print(f"[bold]step {event.step}[/] model call failed: [red]{plain(event.error)}[/]")
            return
        console.print(f"[bold]step {event.step}[/] model → stop_reason [cyan]{plain(event.stop_reason)}[/]")
        for call in event.tool_calls:
            console.print(f"  calls {plain(call.name)}({plain(_short(call.input))})")
    elif topic == topics.TOOL_BATCHES:
        batch = ExecuteToolBatch.model_validate(data)
        for checked in batch.calls:
            verdict = (
                "[green]approved[/]" if checked.approved else f"[red]rejected[/]: {plain(_short(checked.error, 160))}"
            )
            if checked.hold:
                verdict = f"[yellow]held for a person[/]: {plain(_short(checked.hold.reason, 160))}"
            elif checked.approved_by:
                verdict += f" (approved by {plain(checked.approved_by)})"
            console.print(f"  gate  {plain(checked.name)}: {verdict}")
    elif topic == topics.APPROVAL_REQUESTS:
        asked = ApprovalRequested.model_validate(data)
        waiting.add(asked.approval_id)
        console.print(
            f"  [yellow]waiting for approval of {plain(call_label(asked.call.name, asked.call.input))}[/] "
            f"(approval {asked.approval_id}, deadline in {max(0.0, asked.expires_at - time.time()):.0f} s)"
        )
        console.print(
            f"  [dim]decide: roundtrip approvals approve {asked.approval_id}  |  "
            f"roundtrip approvals deny {asked.approval_id} --reason TEXT[/]"
        )
    elif topic == topics.MODEL_CALLS:
        command = CallModel.model_validate(data)
        last = command.messages[-1] if command.messages else {}
        if command.step and isinstance(last.get("content"), list):
            for block in last["content"]:
                if block.get("type") == "tool_result":
                    mark = "[red]error[/]" if block.get("is_error") else "result"
                    console.print(f"  {mark} {plain(_short(block.get('content'), 140))}")


def show_trace(settings: Settings, wanted: str) -> int:
    """The spans of one turn (turn id or trace id): from Jaeger's query API if configured, else the span files."""
    try:
        trace_id, mine = traces.read(settings, wanted)
    except traces.TraceUnreadable as exc:
        if settings.effective_jaeger_query_url:
            console.print(f"[red]{escape(str(exc))}[/]; is it up? (ROUNDTRIP_JAEGER_QUERY_URL)")
            return 2
        console.print(
            f"[red]{escape(str(exc))}[/]; with ROUNDTRIP_OTLP_ENDPOINT set, set ROUNDTRIP_JAEGER_QUERY_URL "
            "to read the trace from Jaeger"
        )
        return 1
    if not mine:
        where = settings.effective_jaeger_query_url or settings.effective_span_file
        console.print(f"[red]no spans[/] for {escape(wanted)} in {where}")
        return 1
    _print_trace(trace_id, mine)
    return 0


def _print_trace(trace_id: str, spans: list[dict[str, Any]]) -> None:
    mine = sorted(spans, key=lambda s: s["start_ns"])
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    ids = {s["span_id"] for s in mine}
    for s in mine:
        children[s["parent_id"] if s["parent_id"] in ids else None].append(s)
    t0 = mine[0]["start_ns"]
    table = Table(title=f"trace {trace_id}", box=None, pad_edge=False)
    for column, justify in (("start ms", "right"), ("took ms", "right"), ("service", "left"), ("span", "left")):
        table.add_column(column, justify="right" if justify == "right" else "left")

    def add(span: dict[str, Any], depth: int) -> None:
        took = (span["end_ns"] - span["start_ns"]) / 1e6
        name = ("  " * min(depth, 12)) + plain(span["name"])
        if span["status"] == "ERROR":
            name += " [red]ERROR[/]" + (
                f" [red]{plain(_short(span['status_message'], 80))}[/]" if span.get("status_message") else ""
            )
        attrs = span["attributes"]
        extra = " ".join(
            f"{k.split('.')[-1]}={plain(attrs[k])}"
            for k in (
                "roundtrip.step",
                "roundtrip.decision",
                "roundtrip.outcome",
                "roundtrip.approved",
                "roundtrip.detail",
            )
            if attrs.get(k) not in (None, "")
        )
        table.add_row(
            f"{(span['start_ns'] - t0) / 1e6:.1f}",
            f"{took:.1f}",
            plain(str(span["service"]).removeprefix("roundtrip-")),
            f"{name} [dim]{extra}[/]",
        )
        for child in children.get(span["span_id"], []):
            add(child, depth + 1)

    for root in children[None]:
        add(root, 0)
    console.print(table)


def _ledger_missing(settings: Settings, url: str | None = None) -> bool:
    """A SQLite ledger that does not exist means the wrong folder, not an empty fleet: say so, create nothing."""
    url = url or settings.ledger_db_url
    if url.startswith("sqlite") and not Path(url.split(":///", 1)[-1]).exists():
        console.print(
            f"[red]error:[/] no turn ledger at {url.split(':///', 1)[-1]}; run this where the fleet runs, "
            "or set ROUNDTRIP_STATE_DIR / ROUNDTRIP_LEDGER_DATABASE_URL"
        )
        return True
    return False


async def list_turns(settings: Settings, status: str | None, customer: str | None, limit: int) -> int:
    from roundtrip._kernel.storage.ledger_reads import TurnReads

    if _ledger_missing(settings):
        return 2
    ledger = await TurnReads.open(settings.ledger_db_url, read_only=True)
    try:
        rows = await ledger.list(status=status, customer_id=customer, limit=limit)
        size = await ledger.size()
    finally:
        await ledger.close()
    table = Table(box=None, pad_edge=False)
    for column in (
        "turn",
        "status",
        "customer",
        "step",
        "outcome",
        "cost $",
        "tokens in/out",
        "age s",
        "idle s",
        "trace id",
    ):
        table.add_column(column)
    now = time.time()
    colours = {
        "running": "cyan",
        "stuck": "red",
        "waiting": "blue",
        "awaiting": "yellow",
        "ending": "magenta",
        "ended": "dim",
    }
    for r in rows:
        idle = "" if r.status == "ended" else f"{now - r.last_progress_at:.0f}"
        table.add_row(
            plain(r.turn_id),
            f"[{colours[r.status]}]{r.status}[/]",
            plain(r.customer_id),
            str(r.step),
            plain(r.outcome or ""),
            f"{r.cost_usd:.4f}",
            f"{r.input_tokens + r.cache_creation_input_tokens + r.cache_read_input_tokens}/{r.output_tokens}",
            f"{now - r.started_at:.0f}",
            idle,
            plain(r.trace_id),
        )
    console.print(table if rows else "no turns")
    console.print(f"[dim]{plain(size.line(settings.ledger_retention_s))}[/]")
    return 0


async def list_conversations(settings: Settings, customer: str | None, limit: int) -> int:
    from roundtrip._kernel.storage.ledger_reads import ConversationReads

    if _ledger_missing(settings, settings.conversations_db_url):
        return 2
    store = await ConversationReads.open(settings.conversations_db_url, read_only=True)
    try:
        rows = await store.list(customer_id=customer, limit=limit)
    finally:
        await store.close()
    table = Table(box=None, pad_edge=False)
    for column in (
        "conversation",
        "customer",
        "turns",
        "in history",
        "dropped",
        "history tokens",
        "idle s",
        "expires in h",
    ):
        table.add_column(column)
    now = time.time()
    for r in rows:
        table.add_row(
            plain(r.conversation_id),
            plain(r.customer_id),
            str(r.turns),
            str(r.history_turns),
            str(r.dropped_turns),
            str(r.history_tokens),
            f"{now - r.updated_at:.0f}",
            f"{(r.updated_at + settings.conversation_retention_s - now) / 3600:.1f}",
        )
    console.print(table if rows else "no conversations")
    return 0


async def forget_conversation(settings: Settings, conversation_id: str) -> int:
    from roundtrip._guard.conversations import Conversations

    if _ledger_missing(settings, settings.conversations_db_url):
        return 2
    store = await Conversations.open(
        settings.conversations_db_url, settings.history_tokens, settings.conversation_retention_s
    )
    try:
        forgotten = await store.forget(conversation_id)
    finally:
        await store.close()
    if not forgotten:
        console.print(f"[red]no conversation {plain(conversation_id)}[/]")
        return 1
    console.print(
        f"conversation {plain(conversation_id)} forgotten: its history is deleted (a turn still running in it saves "
        "nothing)"
    )
    return 0


APPROVAL_COLUMNS = (
    "approval",
    "status",
    "customer",
    "call",
    "why",
    "waiting s",
    "deadline in s",
    "decided by",
    "turn",
    "trace id",
)
REASON_WIDTH = 24  # the "why" column wraps, at least this wide (or its longest reason)


async def list_approvals(settings: Settings, everything: bool, limit: int) -> int:
    """Calls waiting for a person (or, with everything, every approval with who decided and when)."""
    from roundtrip._kernel.storage.ledger_reads import PENDING, TurnReads

    if _ledger_missing(settings):
        return 2
    ledger = await TurnReads.open(settings.ledger_db_url, read_only=True)
    try:
        rows = await ledger.list_approvals(status=None if everything else PENDING, limit=limit)
    finally:
        await ledger.close()
    now = time.time()
    cells = []
    for r in rows:
        request = ApprovalRequested.model_validate_json(r.request_json)
        decided = (
            f"{r.decided_by} at {time.strftime('%H:%M:%S', time.localtime(r.decided_at))}"
            if r.decided_by and r.decided_at
            else ""
        )
        cells.append(
            (
                r.approval_id,
                r.status,
                r.customer_id,
                call_label(r.tool, request.call.input),
                _short(r.reason, 90),
                f"{(r.decided_at or now) - r.requested_at:.0f}",
                f"{r.expires_at - now:.0f}" if r.status == PENDING else "",
                decided,
                r.turn_id,
                request.turn.trace_id,
            )
        )
    if not rows:
        console.print("no approvals" if everything else "no calls are waiting for approval")
        return 0
    table = Table(box=None, pad_edge=False)
    for i, column in enumerate(APPROVAL_COLUMNS):
        longest = max(len(column), *(len(c[i]) for c in cells))
        whole = column != "why"  # only the reason wraps: the ids and the call are never cut (people copy them)
        table.add_column(column, no_wrap=whole, min_width=longest if whole else min(longest, REASON_WIDTH))
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))  # as text: a label or a reason is never read as markup
    _print_wide(table, Measurement.get(console, console.options.update(width=10_000), table).minimum)
    return 0


def _print_wide(renderable: RenderableType, needed: int) -> None:
    """Print `renderable` `needed` columns wide when the terminal is narrower (the terminal wraps the lines) rather than
    cut or drop a column: Console.print itself never renders wider than the console."""
    width = max(console.width, needed)
    console.print(Segments(console.render(renderable, console.options.update_width(width))), crop=False)


async def decide(settings: Settings, approval_id: str, approve: bool, reason: str, decided_by: str) -> int:
    """Sign a decision and publish it to turn.approval_decisions: the same checks and message as the console's."""
    from roundtrip._console.decisions import decision_signer, refusal, signed_decision
    from roundtrip._kernel.settings import ConfigurationError
    from roundtrip._kernel.storage.ledger_reads import TurnReads

    try:  # the key first: a placeholder, a malformed or (outside development) the published key signs nothing
        settings.refuse_unfit_keys("roundtrip approvals", ("decision_signing_key",))
    except ConfigurationError as exc:
        console.print(f"[red]{plain(str(exc))}[/]")
        return 2
    if _ledger_missing(settings):
        return 2
    ledger = await TurnReads.open(settings.ledger_db_url, read_only=True)
    try:
        row = await ledger.approval(approval_id)
        turn = await ledger.get(row.turn_id) if row else None
    finally:
        await ledger.close()
    refused = refusal(approval_id, row, turn)
    if refused is not None:
        hint = " (see `roundtrip approvals`)" if refused.status == 404 else ""
        console.print(f"[red]{plain(refused.message)}[/]{hint}")
        return 1
    row = cast("ApprovalRow", row)  # no refusal: the approval exists
    decision = signed_decision(row, approve, reason, decided_by, decision_signer(settings))
    producer = kafka_clients(settings).producer()
    try:
        await producer.start()
        await producer.send_and_wait(
            topics.t(topics.APPROVAL_DECISIONS, settings.topic_prefix),
            decision.model_dump_json().encode(),
            key=row.conversation_id.encode(),
        )
    finally:
        await producer.stop()
    request = ApprovalRequested.model_validate_json(row.request_json)
    console.print(
        f"{'approved' if approve else 'denied'} {plain(call_label(row.tool, request.call.input))} for "
        f"{plain(row.customer_id)} "
        f"(approval {plain(approval_id)}, turn {row.turn_id}) as {plain(decided_by)}; the guard resumes the turn"
    )
    return 0


async def cancel_turn(settings: Settings, turn_id: str, reason: str) -> int:
    from roundtrip._console.decisions import cancel_command
    from roundtrip._kernel.storage.ledger_reads import TurnReads
    from roundtrip._kernel.storage.turnstore import ENDED

    if _ledger_missing(settings):
        return 2
    ledger = await TurnReads.open(settings.ledger_db_url, read_only=True)
    try:
        row = await ledger.get(turn_id)
    finally:
        await ledger.close()
    if row is None:
        console.print(f"[red]no turn {plain(turn_id)}[/] in the ledger ({shown(settings.ledger_db_url)})")
        return 1
    if row.status == ENDED:
        console.print(f"turn {plain(turn_id)} already ended ({plain(row.outcome)})")
        return 0
    producer = kafka_clients(settings).producer()
    try:
        await producer.start()
        command = cancel_command(row, reason, "the roundtrip CLI")
        await producer.send_and_wait(
            topics.t(topics.TURN_CONTROLS, settings.topic_prefix),
            command.model_dump_json().encode(),
            key=row.conversation_id.encode(),
        )
    finally:
        await producer.stop()
    console.print(
        f"cancel sent for turn {plain(turn_id)} (customer {plain(row.customer_id)}); the guard ends it with a polite "
        "reply"
    )
    return 0


async def show_dead_letters(settings: Settings, limit: int) -> int:
    """The last `limit` dead letters, newest last, each marked waiting or as the console handled it."""
    from roundtrip._kernel.kafka.dead_letters import DeadLetterReader, LettersAway

    reader = DeadLetterReader(settings, limit, "roundtrip-dead-letters", timeout_s=60.0)
    try:
        await reader.read()
    except LettersAway as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        return 2
    finally:
        await reader.close()
    tail = reader.tail()
    if not tail:
        console.print("no dead letters")
        return 0
    for item, handling in tail:
        _print_letter(item, handling)
    waiting = sum(1 for _, handling in tail if handling is None)
    console.print(
        f"{len(tail)} shown: {waiting} waiting, {len(tail) - waiting} handled "
        "(re-drive or discard one on the console's /dead-letters page)"
    )
    return 0


def _print_letter(item: Letter, handling: DeadLetterHandled | None) -> None:
    from roundtrip._kernel.kafka.dead_letters import PAST

    def stamp(at: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))

    done = plain(PAST.get(handling.action, handling.action)) if handling else ""
    letter = item.letter
    what = (
        f"{plain(letter.service)} could not process {plain(letter.topic)} (partition {letter.partition}, offset "
        f"{letter.offset}, key {plain(letter.key)})"
        if letter
        else "a record"
    )
    state = f"[green]{done}[/]" if handling else "[yellow]waiting[/]"
    console.print(f"[bold]{stamp(item.at)}[/] {plain(item.id)} {state} {what}: [red]{plain(item.reason)}[/]")
    if handling is not None:
        to = f" to {plain(handling.topic)}" if handling.topic else ""
        note = f": {plain(handling.note)}" if handling.note else ""
        console.print(f"  {done} by {plain(handling.by)} at {stamp(handling.at)}{to}{note}")
    console.print(f"  {plain(_short(_as_bytes_say(letter) if letter else item.raw, 300))}")


def _as_bytes_say(letter: DeadLettered) -> str:
    """The record as its lossless copy says (what a re-drive would publish), else the readable copy."""
    from roundtrip._kernel.kafka.dead_letters import copy_of

    try:
        value = copy_of(letter).value if letter.payload_base64 else None
    except ValueError:
        value = None
    return letter.payload if value is None else value[:2000].decode("utf-8", "replace")


async def show_lag(settings: Settings, group: str | None, as_json: bool, watch: float | None) -> int:
    """Each consumer group's lag per topic and partition, its total, and its members; refreshed every `watch` s."""
    import asyncio

    from roundtrip._kernel.kafka.admin import consumer_lag

    while True:
        report = await consumer_lag(kafka_clients(settings), settings.topic_prefix, group)
        if as_json:
            print(
                json.dumps(
                    {
                        "at": round(time.time(), 3),
                        "bootstrap": settings.bootstrap_servers,
                        "groups": [g.as_dict() for g in report],
                    }
                ),
                flush=True,
            )
        else:
            if watch:
                console.clear()
            _render_lag(report, settings)
        if not watch:
            return 0
        await asyncio.sleep(watch)


def _render_lag(report: list[GroupLag], settings: Settings) -> None:
    table = Table(
        box=None, pad_edge=False, title=f"consumer lag at {time.strftime('%H:%M:%S')} ({settings.bootstrap_servers})"
    )
    for column, justify in (
        ("group", "left"),
        ("state", "left"),
        ("topic", "left"),
        ("partition", "right"),
        ("committed", "right"),
        ("end", "right"),
        ("lag", "right"),
    ):
        table.add_column(column, justify="right" if justify == "right" else "left")
    for g in report:
        state = g.state if g.state == "Stable" else f"[yellow]{g.state}[/]"
        for i, p in enumerate(g.partitions):
            committed = "-" if p.committed is None else str(p.committed)
            lag = f"[red]{p.lag}[/]" if p.lag else "0"
            table.add_row(
                plain(g.group) if i == 0 else "",
                state if i == 0 else "",
                plain(p.topic),
                str(p.partition),
                committed,
                str(p.end),
                lag,
            )
        total = f"[bold red]{g.lag}[/]" if g.lag else "[bold]0[/]"
        table.add_row(
            "" if g.partitions else plain(g.group),
            "" if g.partitions else state,
            "[bold]total[/]",
            "",
            "",
            "",
            total,
            end_section=True,
        )
    console.print(table)
    members = Table(box=None, pad_edge=False, title="members")
    for column in ("group", "client id", "host", "assigned partitions"):
        members.add_column(column)
    for g in report:
        for m in g.members:
            assigned = ", ".join(f"{t}[{n}]" for t, n in m.partitions) or "-"
            members.add_row(plain(g.group), plain(m.client_id), plain(m.host), plain(assigned))
        if not g.members:
            members.add_row(plain(g.group), "[yellow](no members)[/]", "", "")
    console.print(members)
