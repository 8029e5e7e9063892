"""Turn start and conversation order (turn.starts): every turn starts here, once.

A turn starts only for the customer who owns its conversation (anyone else gets a refusal and sees nothing), only
once the conversation's previous turn has ended, and with the conversation's history at the head of its transcript.
The start is recorded with its first decision in one conditional insert: a duplicate request is dropped, and a start
recorded but maybe not published is published again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from roundtrip._guard.conversations import Claim, Conversations
from roundtrip._guard.ledger import BATCH, Ledger, TurnRow
from roundtrip._guard.loop import StepClock
from roundtrip._guard.outbox import Outbox, pending_copy, traceparent
from roundtrip._guard.replies import Replies
from roundtrip._guard.versions import Ramp
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.wire.events import CallModel, Outcome, StartTurn, Turn, TurnEnded

log = logging.getLogger("roundtrip.guard")
security = logging.getLogger("roundtrip.security")


class ConversationOrder:
    """Turns of one conversation run one after another: a start waits while another turn of its conversation is live.

    `ended` wakes them at once for an end this replica publishes; another replica's is seen by polling the ledger."""

    def __init__(self, ledger: Ledger, give_up_after_s: float, poll_s: float) -> None:
        self.ledger, self.give_up_after_s, self.poll_s = ledger, give_up_after_s, poll_s
        self._ended: dict[str, asyncio.Event] = {}

    def ended(self, conversation_id: str) -> None:
        if (event := self._ended.get(conversation_id)) is not None:
            event.set()

    async def wait_for_earlier_turns(self, turn: Turn) -> float:
        """Wait until no other turn of its conversation is live (at most give_up_after_s); the seconds waited."""
        started = time.monotonic()
        give_up = started + self.give_up_after_s
        conversation = turn.conversation_id
        announced = False
        while True:
            ended = self._ended.setdefault(conversation, asyncio.Event())  # before the read: no lost wake-up
            live = await self.ledger.live_turns(conversation, but=turn.turn_id)
            if not live:
                break
            if not announced:
                announced = True
                log.info(
                    "turn %s waits for turn %s of conversation %s to end", turn.turn_id, live[0].turn_id, conversation
                )
                trace.get_current_span().add_event(
                    "waiting for the conversation's running turn", {"roundtrip.waits_for": live[0].turn_id}
                )
            if time.monotonic() > give_up:
                log.warning(
                    "turn %s: turn %s of its conversation is still not ended; starting anyway",
                    turn.turn_id,
                    live[0].turn_id,
                )
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), self.poll_s)
            self._ended.pop(conversation, None)
        self._ended.pop(conversation, None)
        waited = time.monotonic() - started
        if announced:
            trace.get_current_span().set_attribute("roundtrip.conversation_wait_s", round(waited, 3))
        return waited


@dataclass
class Starts:
    ledger: Ledger
    outbox: Outbox
    order: ConversationOrder
    replies: Replies
    turn_deadline_s: float
    conversations: Conversations | None  # None: every request stands alone
    steps: StepClock
    agent_digest: str
    ramp: Ramp  # the agent version a new conversation starts on

    async def on_start(self, command: StartTurn) -> str:
        """A new turn: the ledger's read beside the conversation's claim, then the turn recorded beside its exchange
        opened. A start that waits for the conversation's running turn reads the history after that turn's end."""
        turn = command.turn
        assigned = await self.ramp.version(turn.conversation_id, None)  # if the conversation is new
        # a duplicate's claim changes nothing: it touches its own conversation, or finds someone else's
        (row, running), claim = await asyncio.gather(
            self.ledger.starting(turn.turn_id, turn.conversation_id), self._claim(turn, assigned)
        )
        if row is not None:
            return await self._started_before(row, command)
        history: list[dict[str, Any]] = []
        if claim is not None:
            if claim.owner != turn.customer_id:
                return await self._refuse(command)
            if running:  # its exchange is stored with its end (or, in a database of its own, right after it)
                await self.order.wait_for_earlier_turns(turn)
                await self._wait_for_exchanges([r.turn_id for r in running])
            if self.conversations is not None and (claim.stored_turns or running):
                history = await self.conversations.history(turn.conversation_id)
        version = await self._version(turn, claim, assigned)
        now = time.time()
        digest = "" if version else self.agent_digest  # the guard runs the default version's agent
        changes: dict[str, float | int | str] = {"history_messages": len(history), "agent_version": version}
        if digest:
            changes["agent_digest"] = digest
        # the guard's clock sets the deadline; it travels with the turn: the gate signs it. A batch turn keeps the one
        # the gateway gave it (ROUNDTRIP_BATCH_DEADLINE_S): its answers may take hours
        batch = turn.lane == BATCH and turn.deadline_at > 0
        changes["deadline_at"] = turn.deadline_at if batch else round(now + self.turn_deadline_s, 3)
        turn = turn.model_copy(update=changes)
        call = CallModel(turn=turn, step=0, messages=[*history, {"role": "user", "content": command.text}])
        if history:
            trace.get_current_span().set_attribute("roundtrip.history_messages", len(history))
        pending = pending_copy(call)
        recorded = self.ledger.start(
            turn.model_dump(mode="json"),
            pending,
            traceparent(),
            now=now,
            deadline_at=turn.deadline_at,
            agent_digest=digest,
            agent_version=version,
        )
        # side by side: a start recorded without its exchange opens it when it is republished (_started_before)
        started, _ = await asyncio.gather(recorded, self._open(command))
        if started:
            self.steps.stepped(turn.turn_id, ended=False)
            await self.outbox.emit(turn.turn_id, pending, call, turn.conversation_id)
            return "started"
        row = await self.ledger.get(turn.turn_id)
        return await self._started_before(row, command) if row is not None else "duplicate"

    async def _version(self, turn: Turn, claim: Claim | None, assigned: str) -> str:
        """A conversation's turns run on the version its first turn was assigned (its history was written by it);
        one of a draining version moves, and the move is recorded."""
        if claim is None or self.conversations is None:
            return assigned
        version = await self.ramp.version(turn.conversation_id, claim.agent_version)
        if version != claim.agent_version:
            await self.conversations.pin(turn.conversation_id, version)
            log.info(
                "conversation %s: agent version %r drains, its turns move to %r",
                turn.conversation_id,
                claim.agent_version,
                version,
            )
        return version

    async def _wait_for_exchanges(self, turn_ids: list[str]) -> None:
        """Conversations in a database of their own: an ended turn's exchange is stored just after the ledger's end,
        so wait for it too (as long as for the turn itself: a crash in between leaves it to the end's redelivery)."""
        conversations = self.conversations
        if conversations is None or conversations.shares(self.ledger):
            return
        give_up = time.monotonic() + self.order.give_up_after_s
        while await conversations.still_open(turn_ids) and time.monotonic() < give_up:
            await asyncio.sleep(self.order.poll_s)

    async def _claim(self, turn: Turn, version: str) -> Claim | None:
        return (
            None
            if self.conversations is None
            else await self.conversations.claim(turn.conversation_id, turn.customer_id, version, time.time())
        )

    async def _open(self, command: StartTurn) -> None:
        if self.conversations is not None:
            turn = command.turn
            await self.conversations.open_turn(turn.conversation_id, turn.turn_id, command.text, time.time())

    async def _started_before(self, row: TurnRow, command: StartTurn) -> str:
        """A start the ledger has seen: republish its first decision if that may not be out, else drop it."""
        if row.step == 0 and row.pending:
            # not refused: its exchange may not have been opened (the start failed after the record)
            if row.outcome is None:
                await self._open(command)
            await self.outbox.republish(row)
            return "republished"
        log.info("turn %s: duplicate request %s dropped", row.turn_id, row.request_id)
        return "duplicate"

    async def _refuse(self, command: StartTurn) -> str:
        """A request naming another customer's conversation: a polite refusal, no history, no model call."""
        turn = command.turn
        now = time.time()
        outcome = Outcome.CONVERSATION_REFUSED
        ended = TurnEnded(turn=turn, step=0, outcome=outcome, text=self.replies.polite(outcome))
        pending = pending_copy(ended)
        if not await self.ledger.start(
            turn.model_dump(mode="json"),
            pending,
            traceparent(),
            now=now,
            outcome=outcome.value,
            agent_digest=self.agent_digest,
        ):
            row = await self.ledger.get(turn.turn_id)
            return await self._started_before(row, command) if row is not None else "duplicate"
        security.warning(
            "turn %r refused: customer %r named conversation %r of another customer (request %r)",
            turn.turn_id,
            turn.customer_id,
            turn.conversation_id,
            turn.request_id,
        )
        trace.get_current_span().add_event("conversation refused: it belongs to another customer")
        metrics.count_turn_end(outcome.value, 0, turn.agent_version)
        await self.outbox.emit(turn.turn_id, pending, ended, turn.conversation_id)
        return "refused"
