"""What `roundtrip ask` and `chat` show in a terminal.

`ask` is a plain Kafka client like a user's app: it publishes a SupportRequest and
reads support.replies, and meanwhile follows the internal topics (without a consumer
group, from their ends) to show each step of the turn as it happens. `chat` does the same
for each line typed, all in one conversation (the guard keeps its history).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from rich.text import Text

from roundtrip._cli.common import call_label, console, plain, plural, short
from roundtrip._cli.live_order import StepOrder
from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.kafka.clients import kafka_clients
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import (
    ApprovalDecided,
    ApprovalRequested,
    CallModel,
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
        order = StepOrder(request.request_id, SYSTEM)  # what Kafka's fetches return, in the order it happened
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
    seen: dict[str, str | None],
    waiting: set[str],
) -> SupportReply | None:
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
            console.print(f"  calls {plain(call.name)}({plain(short(call.input))})")
    elif topic == topics.TOOL_BATCHES:
        batch = ExecuteToolBatch.model_validate(data)
        for checked in batch.calls:
            verdict = (
                "[green]approved[/]" if checked.approved else f"[red]rejected[/]: {plain(short(checked.error, 160))}"
            )
            if checked.hold:
                verdict = f"[yellow]held for a person[/]: {plain(short(checked.hold.reason, 160))}"
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
                    console.print(f"  {mark} {plain(short(block.get('content'), 140))}")
