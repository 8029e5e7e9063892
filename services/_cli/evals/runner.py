"""Run a suite's cases through the running fleet as a user's app would: each turn a SupportRequest published on
support.requests, its reply read from support.replies, and what happened on the way read from the turn's topics.

With no API key a turn's script is put to the simulator first, under a name of this run's own, and the request names
it; with a key the real model answers. A held call is decided as the case says, signed with the fleet's decision key.
With `--version v2` each run's new conversation is claimed for v2 before its first turn, as the guard claims one: the
guard then keeps it on v2, whatever the ramp says (docs/decisions/agent-versions.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from roundtrip._cli.evals.cases import Case, Turn
from roundtrip._cli.evals.verdict import Observed, failures
from roundtrip._guard.conversations import Conversations
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.kafka.clients import kafka_clients
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.versions import DEFAULT, RampRefused, Versions, checked_name, named, shown
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import (
    ApprovalRequested,
    ExecuteToolBatch,
    ModelResponded,
    SupportReply,
    SupportRequest,
)

WATCHED = (topics.SUPPORT_REPLIES, topics.ITERATIONS, topics.TOOL_BATCHES, topics.APPROVAL_REQUESTS)
DECIDED_BY = "roundtrip-eval"


class FleetUnavailable(RuntimeError):
    """The fleet cannot be asked (its topics missing, its simulator refusing a script): one line says why."""


@dataclass
class RunResult:
    """One run of a case: every turn's failures (prefixed by the turn when it has several), and what it cost."""

    failures: list[str] = field(default_factory=list)
    outcome: str = ""
    steps: int = 0
    tools: list[str] = field(default_factory=list)
    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    conversation: str = ""

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass
class CaseResult:
    case: Case
    runs: list[RunResult] = field(default_factory=list)
    skipped: str | None = None

    @property
    def pass_rate(self) -> float:
        return sum(r.passed for r in self.runs) / len(self.runs) if self.runs else 0.0

    @property
    def passed(self) -> bool:
        return self.skipped is not None or (bool(self.runs) and self.pass_rate >= self.case.min_pass_rate - 1e-9)


class Asker:
    """A producer of support requests and a reader of the turns' topics, shared by every run of the suite; with a
    `version` (as the operator names it; None: the ramp decides), the claimer of each run's conversation for it."""

    def __init__(self, settings: Settings, version: str | None) -> None:
        self.settings, self.version = settings, named(version) if version is not None else None
        self.conversations: Conversations | None = None
        self.names = {topics.t(n, settings.topic_prefix): n for n in WATCHED}
        kafka = kafka_clients(settings)
        self.consumer = kafka.consumer(enable_auto_commit=False, isolation_level="read_committed")
        self.producer = kafka.producer()
        self.turns: dict[str, Observed] = {}
        self.approvals: dict[str, asyncio.Queue[ApprovalRequested]] = {}
        self.replied: dict[str, asyncio.Event] = {}
        self.token = uuid.uuid4().hex[:8]  # this run's own script names and conversation ids
        self.http = httpx.AsyncClient(timeout=10)
        self.scripts = 0

    async def start(self) -> None:
        await self.consumer.start()
        partitions = await partitions_of(self.consumer, self.names)
        if not partitions:
            raise FleetUnavailable("the fleet's topics do not exist; is the fleet up? (roundtrip up)")
        self.consumer.assign(partitions)
        await self.consumer.seek_to_end(*partitions)
        for tp in partitions:  # positions resolved now: nothing published after this is missed
            await self.consumer.position(tp)
        await self.producer.start()
        if self.version is not None:
            self.conversations = await pinning(self.settings, self.version)
        self.reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        if reader := getattr(self, "reader", None):
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        await self.consumer.stop()
        await self.producer.stop()
        await self.http.aclose()
        if self.conversations is not None:
            await self.conversations.close()

    async def _read(self) -> None:
        while True:
            for records in (await self.consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    with contextlib.suppress(ValueError):
                        self._note(self.names[record.topic], json.loads(record.value))

    def _note(self, name: str, data: dict[str, Any]) -> None:
        if name == topics.SUPPORT_REPLIES:
            seen = self.turns.get(data.get("request_id", ""))
            if seen is not None and seen.reply is None:
                seen.reply = SupportReply.model_validate(data)
                self.replied[seen.request_id].set()
            return
        seen = self.turns.get(data.get("turn", {}).get("request_id", ""))
        if seen is None:
            return
        if name == topics.ITERATIONS:
            responded = ModelResponded.model_validate(data)
            seen.versions.add(responded.turn.agent_version)
            for call in responded.tool_calls:
                seen.calls.setdefault(call.id, call.name)
        elif name == topics.TOOL_BATCHES:
            for checked in ExecuteToolBatch.model_validate(data).calls:
                if not checked.approved and checked.hold is None:
                    seen.refused.setdefault(checked.id, (checked.name, checked.error or ""))
        elif name == topics.APPROVAL_REQUESTS:
            asked = ApprovalRequested.model_validate(data)
            if asked.approval_id not in seen.held:
                seen.held[asked.approval_id] = (asked.call.name, asked.reason)
                self.approvals[seen.request_id].put_nowait(asked)

    async def pin(self, conversation: str, customer: str) -> None:
        """A new conversation claimed for this run's version (none asked: nothing to do)."""
        if self.conversations is not None and self.version is not None:
            await self.conversations.claim(conversation, customer, self.version, time.time())

    def script_name(self) -> str:
        """A name of this run's own for a turn's script (short: a request's persona holds at most 40 characters)."""
        self.scripts += 1
        return f"eval-{self.token}-{self.scripts}"

    async def put_script(self, name: str, responses: list[Any]) -> None:
        url = f"{self.settings.model_base_url}/v1/_scripts/{name}"
        try:
            answer = await self.http.put(url, json=responses)
        except httpx.HTTPError as exc:
            raise FleetUnavailable(
                f"the simulator at {url} cannot be reached ({type(exc).__name__}); is the fleet up?"
            ) from None
        if answer.status_code != 200:
            raise FleetUnavailable(f"the simulator refused script {name}: {_error_of(answer)}")

    async def turn(self, customer: str, conversation: str, turn: Turn, persona: str | None, timeout: float) -> Observed:
        request = SupportRequest(
            request_id=f"req_eval_{uuid.uuid4().hex[:12]}",
            conversation_id=conversation,
            customer_id=customer,
            text=turn.message,
            persona=persona,
        )
        self.turns[request.request_id] = Observed(request.request_id)
        self.replied[request.request_id] = asyncio.Event()
        self.approvals[request.request_id] = asyncio.Queue()
        await self.producer.send_and_wait(
            topics.t(topics.SUPPORT_REQUESTS, self.settings.topic_prefix),
            request.model_dump_json().encode(),
            key=conversation.encode(),
        )
        deciding = asyncio.create_task(self._decide_each(request.request_id, turn.decide == "approve"))
        replied = asyncio.create_task(self.replied[request.request_id].wait())
        try:
            await asyncio.wait({replied, self.reader}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if self.reader.done() and not self.reader.cancelled() and self.reader.exception() is not None:
                raise FleetUnavailable(f"reading the fleet's topics failed: {self.reader.exception()}")
        finally:
            replied.cancel()
            deciding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await deciding
            self.replied.pop(request.request_id, None)
            self.approvals.pop(request.request_id, None)
        return self.turns.pop(request.request_id)

    async def _decide_each(self, request_id: str, approve: bool) -> None:
        while True:
            asked = await self.approvals[request_id].get()
            await self._decide(asked, approve)

    async def _decide(self, asked: ApprovalRequested, approve: bool) -> None:
        """The decision on a held call, once the guard has recorded it (the request may come before its row)."""
        from roundtrip._console.decisions import decision_signer, refusal, signed_decision
        from roundtrip._kernel.storage.ledger_reads import TurnReads

        ledger = await TurnReads.open(self.settings.ledger_db_url, read_only=True)
        try:
            for _ in range(100):
                row = await ledger.approval(asked.approval_id)
                turn = await ledger.get(row.turn_id) if row else None
                if row is not None and refusal(asked.approval_id, row, turn) is None:
                    break
                await asyncio.sleep(0.2)
            else:
                return  # never decidable: the turn ends by its approval deadline, and the case says so
        finally:
            await ledger.close()
        decision = signed_decision(
            row, approve, "decided by roundtrip eval", DECIDED_BY, decision_signer(self.settings)
        )
        await self.producer.send_and_wait(
            topics.t(topics.APPROVAL_DECISIONS, self.settings.topic_prefix),
            decision.model_dump_json().encode(),
            key=row.conversation_id.encode(),
        )


async def run_case(asker: Asker, case: Case, run: int, timeout: float) -> RunResult:
    """One run of a case: its turns in one new conversation, in order."""
    conversation = f"conv_eval_{asker.token}_{case.name[:100]}_{run}"  # within a request's 200 characters
    result = RunResult(conversation=conversation)
    started = time.monotonic()
    await asker.pin(conversation, case.customer)
    simulated = asker.settings.use_simulator
    for i, turn in enumerate(case.turns):
        persona = turn.persona if simulated else None
        if simulated and turn.script is not None:
            name = asker.script_name()
            await asker.put_script(name, turn.script)
            persona = f"script:{name}"
        seen = await asker.turn(case.customer, conversation, turn, persona, timeout)
        where = f"turn {i + 1}: " if len(case.turns) > 1 else ""
        broken = failures(turn.expect, seen) if seen.reply else [f"no reply within {timeout:g} s"]
        if asker.version is not None and (elsewhere := seen.versions - {asker.version}):
            ran = ", ".join(sorted(shown(v) for v in elsewhere))
            broken.append(f"ran on agent version {ran}, not {shown(asker.version)}")
        result.failures += [where + b for b in broken]
        result.tools += seen.tools
        if seen.reply is None:
            break
        reply = seen.reply
        result.outcome, result.steps = reply.outcome.value, result.steps + reply.steps
        result.cost_usd += reply.cost_usd
        result.input_tokens += reply.usage.input_tokens + reply.usage.cache_read_input_tokens
        result.input_tokens += reply.usage.cache_creation_input_tokens
        result.output_tokens += reply.usage.output_tokens
    result.seconds = time.monotonic() - started
    return result


def missing(case: Case, settings: Settings, agent_settings: Any) -> str | None:
    """Why a case is skipped: a setting it needs that neither the fleet nor its agent has set."""
    for name in case.needs:
        if getattr(settings, name, None) is None and getattr(agent_settings, name, None) is None:
            return f"needs ROUNDTRIP_{name.upper()}"
    return None


async def pinning(settings: Settings, version: str) -> Conversations:
    """The conversation store to claim each run's conversation for `version` in, once the ramp's table says the version
    is in service: named there (`roundtrip versions ramp v2 0%` names one without sending it conversations) and not
    draining (the guard would move the conversation on at its first turn)."""
    try:
        if version != DEFAULT:
            checked_name(version)
    except RampRefused as exc:
        raise FleetUnavailable(str(exc)) from None
    store = await Versions.open(settings.ledger_db_url, read_only=True)
    try:
        ramp = await store.shares()
    finally:
        await store.close()
    if version != DEFAULT and version not in ramp.shares:
        raise FleetUnavailable(
            f"agent version {version} is not in this fleet's ramp (roundtrip versions lists them; `roundtrip versions "
            f"ramp {version} 0%` adds it without sending it new conversations)"
        )
    if version in ramp.draining:
        raise FleetUnavailable(
            f"agent version {shown(version)} drains: the guard moves its conversations to another version (roundtrip "
            "versions ramp takes it back into service)"
        )
    return await Conversations.open(
        settings.conversations_db_url, settings.history_tokens, settings.conversation_retention_s
    )


async def run_suite(
    settings: Settings,
    version: str | None,
    cases: list[Case],
    agent_settings: Any,
    timeout: float,
    concurrency: int,
    done: Callable[[CaseResult], None],
) -> list[CaseResult]:
    """Every run of every case (`concurrency` at once) on agent `version` (`v2`, `default`; None: where the ramp sends
    them), each case's result handed to `done` once its runs are in."""
    asker = Asker(settings, version)
    gate = asyncio.Semaphore(concurrency)
    try:
        await asker.start()

        async def one(case: Case, run: int) -> RunResult:
            async with gate:
                return await run_case(asker, case, run, timeout)

        async def each(case: Case) -> CaseResult:
            result = CaseResult(case, skipped=missing(case, settings, agent_settings))
            if result.skipped is None:
                result.runs = list(await asyncio.gather(*(one(case, run) for run in range(case.runs))))
            done(result)
            return result

        return list(await asyncio.gather(*(each(case) for case in cases)))
    finally:
        await asker.stop()


def _error_of(answer: httpx.Response) -> str:
    """The simulator's one-line reason of a refusal (its JSON `error`), else the body as it came."""
    try:
        return str(answer.json()["error"])
    except (ValueError, KeyError, TypeError):
        return answer.text
