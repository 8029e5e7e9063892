"""The gateway's core: a support request in, its turn's StartTurn out (once, when the fleet admits it); a turn's end
in, its one SupportReply out (only for the end the guard recorded).

Built once by `core_of`, run by the service's shell (app.py) per message of support.requests and turn.outcomes; the
ledger's recorded ends and the replies already on support.replies come in its ports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import TopicPartition

from roundtrip._gateway.admission import Lanes
from roundtrip._gateway.intake import SeenRequests, UnknownFields, check_key
from roundtrip._gateway.turns import forged, in_lane, reply_for, start_turn
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.observability.telemetry import (
    PROVIDER_NAMES,
    bind_turn,
    new_turn_ids,
    record_turn_span,
    tracer,
)
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.turnstore import NO_SUCH_TURN, refused
from roundtrip._kernel.wire.events import StartTurn, SupportReply, SupportRequest, TurnEnded
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.gateway")


class RecordedEnds(Protocol):
    """How the guard recorded each turn's end (the ledger, read only: TurnStore)."""

    async def ended_as(self, turn_id: str) -> Any: ...


class Replied(Protocol):
    """The turns whose reply is on support.replies (replied.RepliedTurns)."""

    async def answered(self, turn_id: str) -> bool: ...

    async def claim(self, turn_id: str, tp: TopicPartition, offset: int) -> bool: ...


@dataclass(frozen=True)
class GatewayPorts:
    """The admission of each lane (shared with the throttle, which follows the model's capacity), the recorded ends,
    the replies already sent, and the outlets: a turn's start, and a reply staged in the transaction of its end's
    offset. Each is called inside the message's span, whose context the published record carries."""

    lanes: Lanes
    ledger: RecordedEnds
    replied: Replied
    start: Callable[[StartTurn, str], Awaitable[None]]
    reply: Callable[[SupportReply, str], None]


class GatewayCore:
    def __init__(self, settings: Settings, agent: Agent, ports: GatewayPorts) -> None:
        self.lanes, self.ledger, self.replied = ports.lanes, ports.ledger, ports.replied
        self.settings = settings
        self.send_start, self.stage_reply = ports.start, ports.reply
        self.started, self.unknown = SeenRequests(memory_s=settings.reply_memory_s), UnknownFields()
        self.reply_memory_s = settings.reply_memory_s
        self.agent_name, self.agent_digest = agent.name, agent.digest
        self.model, self.provider = agent.model_for(settings), PROVIDER_NAMES[settings.model_provider]

    async def start(self, request: SupportRequest, key: bytes | None) -> None:
        """The request's StartTurn, sent once the fleet admits it to its lane; nothing for a request already started."""
        self.unknown.note(request)
        check_key(request, key)
        lane = self.settings.lane_of(request.lane)
        command = in_lane(start_turn(request, *new_turn_ids()), lane, self.settings.batch_deadline_s)
        turn = command.turn
        bind_turn(turn.turn_id)
        with tracer().start_as_current_span("turn.start") as span:
            span.set_attributes(
                {"roundtrip.turn_id": turn.turn_id, "roundtrip.customer_id": turn.customer_id, "roundtrip.lane": lane}
            )
            if not self.started.add(turn.turn_id, request):
                span.add_event("duplicate request dropped")
                log.info("duplicate request %r (turn %r) dropped", request.request_id, turn.turn_id)
                return
            if request.lane == "batch" and lane != "batch":
                span.add_event("the batch lane asked on a platform without Message Batches: the turn runs interactive")
            waited = await self.lanes.of(lane).admit(turn.turn_id)
            if waited > 0.001:
                span.set_attribute("roundtrip.admission_wait_s", round(waited, 3))
            log.info("turn %r started for %r (trace %s)", turn.turn_id, turn.customer_id, turn.trace_id)
            await self.send_start(command, turn.conversation_id)

    async def reply(self, ended: TurnEnded, tp: TopicPartition, offset: int) -> None:
        """The turn's one reply, for the end at `offset` of `tp`; nothing for a duplicate. An end the ledger did not
        record is refused (raising: dead-lettered, said on roundtrip.security); one of a turn retention deleted is
        dropped only when it was answered already."""
        turn_id = ended.turn.turn_id
        with tracer().start_as_current_span("turn.reply") as span:
            span.set_attributes({"roundtrip.turn_id": turn_id, "roundtrip.outcome": ended.outcome.value})
            why = forged(ended, await self.ledger.ended_as(turn_id), time.time(), self.reply_memory_s)
            if why == NO_SUCH_TURN and await self.replied.answered(turn_id):
                span.add_event("duplicate outcome of a turn the ledger no longer has dropped")
                return
            if why is not None:
                raise refused(ended.turn, "gateway", f"end not sent: {why}")
            self.lanes.release(turn_id)
            if not await self.replied.claim(turn_id, tp, offset):
                span.add_event("duplicate outcome dropped")
                return
            record_turn_span(
                ended.turn,
                outcome=ended.outcome.value,
                steps=ended.step,
                usage=ended.spent,
                cost_usd=ended.cost_usd,
                agent_name=self.agent_name,
                agent_digest=self.agent_digest,
                model=self.model,
                provider=self.provider,
            )
            # the reply becomes visible with the commit of this message's offset: no second reply after a crash
            self.stage_reply(reply_for(ended), ended.turn.conversation_id)
            metrics.count_reply(ended.turn, ended.outcome.value, time.time())


def core_of(settings: Settings, agent: Agent, ports: GatewayPorts) -> GatewayCore:
    return GatewayCore(settings, agent, ports)
