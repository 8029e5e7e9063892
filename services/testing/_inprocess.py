"""The loop of one turn in this process, through the fleet's own cores, joined by function calls instead of topics.

Each step runs the cores the services' shells run, built by the same factories: the model's (`ModelCore.respond`),
the guard's rules (`Decisions.decided`), the gate's (`GateCore.handle`) and the executor's (`ExecutorCore.handle`);
the gateway's (`GatewayCore.start`, `.reply`) starts the turn and checks its one reply against the end the rules
decided. A held call is decided by `approve`, signed with the decision key as a person's is. The ports are in-memory
(_ports.py). Left out: the broker hops, the guard's ledger and conversation store, the processes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition
from opentelemetry import trace

from roundtrip._executor.core import ExecutorPorts
from roundtrip._executor.core import core_of as executor_core
from roundtrip._gate.core import GatePorts
from roundtrip._gate.core import core_of as gate_core
from roundtrip._gateway.admission import Admission, Lanes
from roundtrip._gateway.core import GatewayPorts
from roundtrip._gateway.core import core_of as gateway_core
from roundtrip._guard.approvals import resumed
from roundtrip._guard.core import decisions_of
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.approvals import Signer
from roundtrip._kernel.wire.events import (
    ApprovalDecided,
    ApprovalRequested,
    CallModel,
    CheckToolCalls,
    Decision,
    ModelResponded,
    StartTurn,
    SupportReply,
    SupportRequest,
    Turn,
    TurnEnded,
    Usage,
)
from roundtrip._model.capacity import Capacity
from roundtrip._model.core import ModelPorts
from roundtrip._model.core import core_of as model_core
from roundtrip._model.port import Model
from roundtrip._sdk.agent import Agent
from roundtrip._sdk.context import Dependencies
from roundtrip.testing._ports import OpenFence, RecordedEnds, Replied, StartedTurns

AWAITING_APPROVAL = "awaiting_approval"  # the outcome of a turn left waiting for a person (no `approve` given)
Approve = Callable[[ApprovalRequested], bool]


@dataclass
class Ended:
    outcome: str
    text: str
    messages: list[dict[str, Any]]
    steps: int
    detail: str = ""
    spent: Usage = field(default_factory=Usage)
    held: ApprovalRequested | None = None
    approvals: list[ApprovalRequested] = field(default_factory=list)


class InProcess:
    """One agent's fleet in this process, `client` its model."""

    def __init__(
        self,
        agent: Agent,
        settings: Settings,
        client: Model,
        capacity: Capacity,
        deps: Dependencies,
        gate_deps: Dependencies,
        wait_for_capacity: bool,
    ) -> None:
        self.agent, self.client, self.settings = agent, client, settings
        self.fence = OpenFence()
        self.model = model_core(settings, ModelPorts(client, self.fence, capacity, wait_for_capacity, time.time()))
        self.gate = gate_core(settings, agent, GatePorts(StartedTurns(), gate_deps))
        self.executor = executor_core(settings, agent, ExecutorPorts(self.fence, deps))
        self.decisions = Signer.of(settings.key_text("decision_signing_key"), "ROUNDTRIP_DECISION_SIGNING_KEY")
        self.rules = decisions_of(settings, agent)
        self.ends, self.started, self.replies = RecordedEnds(), dict[str, StartTurn](), dict[str, SupportReply]()
        forget_after_s = settings.turn_deadline_s + settings.stuck_grace_s + 60
        lanes = Lanes(
            Admission(settings.max_running_turns, forget_after_s),
            Admission(settings.max_running_batch_turns, forget_after_s),
        )
        ports = GatewayPorts(lanes, self.ends, Replied(), self._start, self._reply)
        self.gateway = gateway_core(settings, agent, ports)
        self.replied_at = 0  # the offset of each reply's end, as support.replies' transactions would have it

    async def _start(self, command: StartTurn, conversation_id: str) -> None:
        self.started[command.turn.request_id] = command

    def _reply(self, reply: SupportReply, conversation_id: str) -> None:
        self.replies[reply.turn_id] = reply

    async def new_turn(self, text: str, customer_id: str, persona: str | None) -> Turn:
        """The turn the gateway starts for this request, its deadline as the guard records it."""
        request_id = f"req_{uuid.uuid4().hex[:12]}"
        conversation_id = f"conv_{request_id}"
        request = SupportRequest(
            request_id=request_id, conversation_id=conversation_id, customer_id=customer_id, persona=persona, text=text
        )
        await self.gateway.start(request, conversation_id.encode())
        turn = self.started.pop(request_id).turn
        return turn.model_copy(update={"deadline_at": round(time.time() + self.settings.turn_deadline_s, 3)})

    async def reply(self, ended: TurnEnded) -> SupportReply:
        """The turn's one reply, as the gateway sends it for the end the guard recorded."""
        self.ends.record(ended, time.time())
        self.replied_at += 1
        await self.gateway.reply(ended, _REPLIES, self.replied_at)
        return self.replies.pop(ended.turn.turn_id)

    async def turn(
        self,
        text: str,
        customer_id: str,
        persona: str | None = None,
        approve: Approve | None = None,
        observe: Callable[[ModelResponded], None] | None = None,
    ) -> Ended:
        command: CallModel | ApprovalRequested = CallModel(
            turn=await self.new_turn(text, customer_id, persona), step=0, messages=[{"role": "user", "content": text}]
        )
        approvals: list[ApprovalRequested] = []
        while True:
            if isinstance(command, ApprovalRequested):
                if approve is None:
                    return Ended(
                        AWAITING_APPROVAL,
                        "",
                        command.messages,
                        command.step,
                        command.reason,
                        command.spent,
                        held=command,
                        approvals=approvals,
                    )
                approvals.append(command)
                command = await self._decided(command, approve(command))
                continue
            event = await self.model.respond(command, None)
            assert event is not None  # None comes only from a fence refusing the call, and OpenFence never does
            if observe is not None:
                observe(event)
            hop = self.rules.decided(event, trace.get_current_span())
            if isinstance(hop.message, TurnEnded):
                transcript = (
                    [*event.messages, {"role": "assistant", "content": event.content}]
                    if event.content
                    else event.messages
                )
                reply = await self.reply(hop.message)
                return Ended(
                    reply.outcome.value,
                    reply.text,
                    transcript,
                    event.step,
                    hop.detail,
                    event.spent,
                    approvals=approvals,
                )
            command = hop.message if isinstance(hop.message, CallModel) else await self._run(hop.message)

    async def _run(self, check: CheckToolCalls) -> CallModel | ApprovalRequested:
        hop = await self.executor.handle(await self.gate.handle(check), _taken_as_returned)
        if hop is None:  # the executor said why (logged, on the span)
            raise RuntimeError(f"turn {check.turn.turn_id} step {check.step}: the batch was not run")
        return hop

    async def _decided(self, request: ApprovalRequested, approved: bool) -> CallModel | ApprovalRequested:
        decision = self.decisions.sign(
            ApprovalDecided(
                approval_id=request.approval_id,
                turn_id=request.turn.turn_id,
                tool_use_id=request.call.id,
                input_sha256=request.input_sha256,
                decision=Decision.APPROVE if approved else Decision.DENY,
                decided_by="roundtrip.testing._inprocess",
                decided_at=round(time.time(), 3),
            )
        )
        hop = resumed(request, decision, approved, time.time())
        return hop if isinstance(hop, CallModel) else await self._run(hop)


_REPLIES = TopicPartition("in-process", 0)  # the one "partition" of the loop's turn ends


async def _taken_as_returned(_: CallModel | ApprovalRequested) -> None:
    """The executor's publisher in one process: the loop goes on with the command `handle` returns."""
