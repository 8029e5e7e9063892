"""The model service's batch lane: a batch turn's call is claimed at the fence and recorded before its handler
returns; a task gathers the recorded calls by count and age into one Message Batch, looks at the open batches with
backoff and publishes their results, or cancels one whose turns all ended; a replica leases the batches it polls.
docs/decisions/batch-lane.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anthropic
from opentelemetry.propagate import inject

from roundtrip._kernel.wire.events import CallModel, ModelResponded
from roundtrip._model.attempts import describe, retry_after
from roundtrip._model.batch_answers import AnsweredCalls, Answers, failed
from roundtrip._model.batch_api import BatchApi, Result
from roundtrip._model.calls import Limits, ModelFence
from roundtrip._model.port import CallOptions
from roundtrip._model.takeover import SETTLE_AFTER_S, SettledCalls, Takeover

log = logging.getLogger("roundtrip.model")
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,60}$")  # the API's {1,64}, with room for a retry's suffix
LEASE_MIN_S = 120.0  # a replica's lease on the batches it polls, renewed three times as often
FORGET_EVERY_S = 600.0
PAUSE_S = 5.0  # the lane's pause after the API refused it for its own limits without saying how long
Commands = dict[tuple[str, int], CallModel]


class LaneConcerns(Protocol):
    """The settings the lane reads (BatchLane's and TranscriptLimits')."""

    batch_deadline_s: float
    batch_max_calls: int
    batch_max_wait_s: float
    batch_poll_s: float
    batch_poll_max_s: float
    batch_retry_direct_within_s: float
    max_block_bytes: int
    max_input_depth: int
    max_transcript_bytes: int


class BatchModel(Protocol):
    @property
    def model(self) -> str: ...

    def request(self, messages: list[dict[str, Any]], options: CallOptions) -> dict[str, Any]: ...

    def persona_headers(self, persona: str | None) -> dict[str, str]: ...


class BatchStore(AnsweredCalls, SettledCalls, Protocol):
    async def record(self, row: dict[str, Any]) -> bool: ...

    async def due(self) -> tuple[int, float | None]: ...

    async def take(self, owner: str, now: float, lease_s: float, limit: int) -> tuple[str, list[Any]]: ...

    async def submitted(self, submission: str, batch_id: str) -> None: ...

    async def lease(self, owner: str, now: float, lease_s: float) -> list[tuple[str | None, str | None, float]]: ...

    async def turns_in(self, batch_id: str) -> list[str]: ...

    async def cancelled(self, batch_id: str, now: float) -> None: ...

    async def ended_among(self, turn_ids: list[str]) -> set[str]: ...

    async def forget(self, before: float) -> None: ...


@dataclass(frozen=True)
class BatchPorts:
    """The model, the Batches API, its table (opened at start), the fence, a retry's direct call, the outlet."""

    model: BatchModel
    api: BatchApi
    calls: Callable[[], BatchStore]
    fence: ModelFence
    direct: Callable[[CallModel], Awaitable[ModelResponded | None]]
    publish: Callable[[ModelResponded, str], Awaitable[None]]
    owner: str
    clock: Callable[[], float]


@dataclass
class Poll:
    at: float
    pause: float


def custom_id_of(turn_id: str, step: int) -> str:
    """A call's custom_id: its turn and step, in the characters and length the API takes."""
    plain = f"{turn_id}_{step}"
    return plain if CUSTOM_ID.match(plain) else f"t{hashlib.sha256(turn_id.encode()).hexdigest()[:40]}_{step}"


def current_traceparent() -> str | None:
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")


class BatchLane:
    def __init__(self, settings: LaneConcerns, ports: BatchPorts) -> None:
        self.model, self.api, self.calls, self.fence = ports.model, ports.api, ports.calls, ports.fence
        self.owner, self.clock = ports.owner, ports.clock
        self.max_calls, self.max_wait_s = settings.batch_max_calls, settings.batch_max_wait_s
        self.poll_s, self.poll_max_s = settings.batch_poll_s, max(settings.batch_poll_s, settings.batch_poll_max_s)
        self.lease_s = max(LEASE_MIN_S, 3 * self.poll_max_s)
        self.keep_done_s = settings.batch_deadline_s
        self.tick_s = max(0.05, min(1.0, self.max_wait_s / 4, self.poll_s / 2))
        limits = Limits(settings.max_block_bytes, settings.max_input_depth, settings.max_transcript_bytes)
        self.answers = Answers(
            ports.calls,
            ports.model.model,
            limits,
            ports.direct,
            ports.publish,
            ports.clock,
            settings.batch_retry_direct_within_s,
        )
        self.takeover = Takeover(ports.api, ports.calls)
        self.polls: dict[str, Poll] = {}
        self.unsettled: dict[str, tuple[float, Poll]] = {}  # submission -> (taken at, next look): no batch id known
        self.lease_at = self.forget_at = self.paused_until = 0.0
        self.gathered = 0
        self.wake = asyncio.Event()
        self.failing = False

    async def gather(self, command: CallModel) -> bool:
        """Claim the call at the fence and record it for a batch; False when the fence refuses it."""
        turn = command.turn
        if not await self.fence.claim_model_call(turn, command.step, self.clock()):
            return False
        persona = turn.persona if turn.persona and self.model.persona_headers(turn.persona) else ""
        row = {
            "turn_id": turn.turn_id,
            "step": command.step,
            "custom_id": custom_id_of(turn.turn_id, command.step),
            "grouping": persona[:64],
            "queued_at": self.clock(),
            "traceparent": current_traceparent(),
            "command_json": command.model_dump_json(),
        }
        if await self.calls().record(row):
            self.gathered += 1
            if self.gathered >= self.max_calls:
                self.wake.set()
        return True

    async def run(self) -> None:
        """Until cancelled: submit what is due, look at each open batch when its time comes."""
        while True:
            try:
                await self.tick()
                self.failing = False
            except Exception as exc:  # noqa: BLE001 - the next round tries again; said once per outage
                if not self.failing:
                    log.warning("the batch lane's round failed (%s: %s); tried again", type(exc).__name__, exc)
                self.failing = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.tick_s)
            self.wake.clear()

    async def tick(self) -> None:
        now = self.clock()
        if now < self.paused_until:
            return
        await self.submit_due(now)
        if now >= self.lease_at:
            await self.lease(now)
        for batch_id, poll in list(self.polls.items()):
            if poll.at <= self.clock() and self.clock() >= self.paused_until:
                await self.guarded(f"batch {batch_id}", poll, self.look(batch_id, poll))
        for submission, (taken_at, poll) in list(self.unsettled.items()):
            if poll.at <= self.clock():
                await self.guarded(f"submission {submission}", poll, self.settle(submission, taken_at, poll))
        if now >= self.forget_at:
            self.forget_at = now + FORGET_EVERY_S
            await self.calls().forget(now - self.keep_done_s)

    async def guarded(self, what: str, poll: Poll, work: Awaitable[None]) -> None:
        """One batch's (or submission's) work: a failure puts off only it."""
        try:
            await work
        except Exception as exc:  # noqa: BLE001 - looked at again after its pause, the others now
            log.warning("%s not settled (%s: %s)", what, type(exc).__name__, exc)
            poll.at = self.clock() + poll.pause

    async def submit_due(self, now: float) -> None:
        self.gathered = 0
        while self.clock() >= self.paused_until:
            count, oldest = await self.calls().due()
            if not count or (count < self.max_calls and oldest is not None and oldest > now - self.max_wait_s):
                return
            submission, rows = await self.calls().take(self.owner, now, self.lease_s, self.max_calls)
            if not rows:
                return
            await self.submit(submission, rows)

    async def submit(self, submission: str, rows: list[Any]) -> None:
        commands = {(r.turn_id, r.step): CallModel.model_validate_json(r.command_json) for r in rows}
        ended = await self.calls().ended_among(sorted({r.turn_id for r in rows}))
        for row in [r for r in rows if r.turn_id in ended]:  # its turn ended while the call waited: not sent
            await self.calls().done(row.turn_id, row.step, self.clock())
        live = [r for r in rows if r.turn_id not in ended]
        if not live:
            return
        first = commands[live[0].turn_id, live[0].step].turn
        requests = [{"custom_id": r.custom_id, "params": self.params(commands[r.turn_id, r.step])} for r in live]
        try:
            batch_id = await self.api.create(requests, self.model.persona_headers(first.persona))
        except anthropic.APIStatusError as exc:
            await self.refused(submission, live, commands, exc)
            return
        except anthropic.APIError as exc:  # sent, perhaps created: its results will say (takeover.py)
            log.warning("a batch of %d calls may not have been created (%s): looked for", len(live), describe(exc))
            return
        await self.calls().submitted(submission, batch_id)
        self.polls[batch_id] = Poll(self.clock() + self.poll_s, self.poll_s)
        log.info("batch %s submitted with %d calls", batch_id, len(live))

    def params(self, command: CallModel) -> dict[str, Any]:
        turn = command.turn
        return self.model.request(command.messages, CallOptions(turn.persona, turn.disable_parallel_tool_use, None))

    async def refused(
        self, submission: str, rows: list[Any], commands: Commands, exc: anthropic.APIStatusError
    ) -> None:
        """An error answer, nothing created: for the API's limits or a passing fault the calls wait, else each fails."""
        if exc.status_code in (408, 409, 429) or exc.status_code >= 500:
            await self.calls().requeue(submission)
            self.paused_until = self.clock() + (retry_after(exc) or PAUSE_S)
            log.warning("a batch of %d calls refused for now (%s): submitted again later", len(rows), describe(exc))
            return
        log.error("a batch of %d calls refused (%s): each call fails", len(rows), describe(exc))
        for row in rows:
            command = commands[row.turn_id, row.step]
            error = f"its Message Batch was refused ({describe(exc)})"
            await self.answers.published(row, command, failed(command, self.model.model, error, ""))

    async def look(self, batch_id: str, poll: Poll) -> None:
        """Ask whether the batch ended; answer its calls when it has, else look again after a longer pause."""
        results = self.api.results(batch_id)
        try:
            ended = await self.api.ended(batch_id)
        except anthropic.NotFoundError:
            log.error("batch %s is gone (deleted, or a simulator restarted): its calls are tried once more", batch_id)
            ended, results = True, _none()
        except anthropic.APIError as exc:
            if isinstance(exc, anthropic.RateLimitError):
                self.paused_until = self.clock() + (retry_after(exc) or PAUSE_S)
            log.warning("batch %s: could not ask whether it ended (%s)", batch_id, describe(exc))
            ended = False
        if not ended:
            if self.clock() >= self.paused_until and await self.abandoned(batch_id):
                return
            poll.at, poll.pause = self.clock() + poll.pause, min(poll.pause * 2, self.poll_max_s)
            return
        answered = await self.answers.collect(batch_id, results)
        self.polls.pop(batch_id, None)
        log.info("batch %s ended: %d answers published", batch_id, answered)

    async def abandoned(self, batch_id: str) -> bool:
        """An open batch whose calls' turns all ended (deadline, cancel, the fence) is cancelled: True once it is."""
        turn_ids = await self.calls().turns_in(batch_id)
        if not turn_ids or len(await self.calls().ended_among(turn_ids)) < len(turn_ids):
            return False
        try:
            await self.api.cancel(batch_id)
        except anthropic.APIError as exc:  # it may have ended meanwhile: its results are read and dropped then
            log.warning("batch %s: its turns all ended, but it was not cancelled (%s)", batch_id, describe(exc))
            return False
        await self.calls().cancelled(batch_id, self.clock())
        self.polls.pop(batch_id, None)
        log.info("batch %s cancelled: the %d turns of its calls all ended", batch_id, len(turn_ids))
        return True

    async def lease(self, now: float) -> None:
        """Renew (or take) the leases of the open calls no live lease holds: what this replica polls from now on."""
        leased = await self.calls().lease(self.owner, now, self.lease_s)
        self.lease_at = now + self.lease_s / 3
        batches = {batch_id for batch_id, _, _ in leased if batch_id}
        for batch_id in batches - set(self.polls):
            self.polls[batch_id] = Poll(now, self.poll_s)
        for batch_id in set(self.polls) - batches:
            del self.polls[batch_id]
        unsettled = {submission: at for batch_id, submission, at in leased if not batch_id and submission}
        for submission in unsettled.keys() - self.unsettled.keys():
            taken_at = unsettled[submission]
            self.unsettled[submission] = (taken_at, Poll(max(now, taken_at + SETTLE_AFTER_S), self.poll_s))
        for submission in self.unsettled.keys() - unsettled.keys():
            del self.unsettled[submission]

    async def settle(self, submission: str, taken_at: float, poll: Poll) -> None:
        adopted = await self.takeover.resolve(submission, taken_at)
        if adopted is None:
            poll.at, poll.pause = self.clock() + poll.pause, min(poll.pause * 2, self.poll_max_s)
            return
        del self.unsettled[submission]
        for batch_id in adopted:
            self.polls.setdefault(batch_id, Poll(self.clock(), self.poll_s))


def lane_of(settings: LaneConcerns, ports: BatchPorts) -> BatchLane:
    return BatchLane(settings, ports)


async def _none() -> AsyncIterator[Result]:
    """The results of a batch the API no longer has: none, so each of its open calls counts as unanswered."""
    results: list[Result] = []
    for result in results:
        yield result
