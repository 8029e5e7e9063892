"""The loop of one turn in this process, through the fleet's own code, without Kafka.

Each step runs what the fleet runs: the model service's `call_model`, the guard's `decide` and `continued`, the
gate's `Gate.check` and the executor's `execute`; a held call is decided by `approve`, signed with the decision key
as a person's is. Left out: the broker hops, the ledger and conversation store, the turn fence, the processes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from roundtrip._executor.batches import execute
from roundtrip._executor.runner import runner_for
from roundtrip._gate.of_agent import gate_for
from roundtrip._guard.approvals import resumed
from roundtrip._guard.loop import continued
from roundtrip._guard.replies import Replies
from roundtrip._guard.rules import Finish, decide, policy_from
from roundtrip._guard.side_effects import Acts
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.prices import PriceTable
from roundtrip._kernel.wire.approvals import Signer, Verifier
from roundtrip._kernel.wire.events import (
    ApprovalDecided,
    ApprovalRequested,
    CallModel,
    Decision,
    ModelResponded,
    Turn,
    Usage,
)
from roundtrip._model.calls import Limits, Retrying, call_model
from roundtrip._model.port import Model
from roundtrip._sdk.agent import Agent
from roundtrip._sdk.context import Dependencies

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
        client: Model,
        deps: Dependencies,
        settings: Settings,
        retrying: Retrying | None = None,
        gate_deps: Dependencies | None = None,
    ) -> None:
        self.agent, self.client, self.settings, self.retrying = agent, client, settings, retrying
        self.gate = gate_for(agent, settings, deps if gate_deps is None else gate_deps)
        self.batches = Verifier.of(settings.batch_verify_keys, "ROUNDTRIP_BATCH_VERIFY_KEYS")
        self.decisions = Signer.of(settings.key_text("decision_signing_key"), "ROUNDTRIP_DECISION_SIGNING_KEY")
        self.runner = runner_for(settings, agent, deps)
        words = Replies.of(agent.replies, agent.acted_replies)
        self.policy, self.prices = (
            policy_from(settings, words),
            PriceTable.from_json(settings.prices, settings.model_provider),
        )
        shown = {name: tuple(spec.entity_refs) for name, spec in agent.registry.specs.items()}
        self.acts = Acts(frozenset(agent.serial), agent.describe_action, words, shown)
        self.limits = Limits(settings.max_block_bytes, settings.max_input_depth, settings.max_transcript_bytes)

    def new_turn(self, customer_id: str, persona: str | None = None) -> Turn:
        request_id = f"req_{uuid.uuid4().hex[:12]}"
        return Turn(
            turn_id=f"turn_{request_id}",
            request_id=request_id,
            conversation_id=f"conv_{request_id}",
            customer_id=customer_id,
            persona=persona,
            deadline_at=round(time.time() + self.settings.turn_deadline_s, 3),
        )

    async def turn(
        self,
        text: str,
        customer_id: str,
        persona: str | None = None,
        approve: Approve | None = None,
        observe: Callable[[ModelResponded], None] | None = None,
    ) -> Ended:
        command: CallModel | ApprovalRequested = CallModel(
            turn=self.new_turn(customer_id, persona), step=0, messages=[{"role": "user", "content": text}]
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
            event = await call_model(command, self.client, limits=self.limits, retrying=self.retrying)
            assert event is not None  # None comes only from a fence, and this loop has none
            if observe is not None:
                observe(event)
            model = event.model or self.client.model
            decision = decide(
                event, self.policy, self.prices.cost(model, event.spent), self.prices.cost(model, event.usage)
            )
            if isinstance(decision, Finish):
                transcript = (
                    [*event.messages, {"role": "assistant", "content": event.content}]
                    if event.content
                    else event.messages
                )
                return Ended(
                    decision.outcome.value,
                    self.acts.reply(decision.outcome, decision.text, self.acts.done(event.messages)),
                    transcript,
                    event.step,
                    decision.detail,
                    event.spent,
                    approvals=approvals,
                )
            hop = continued(event, decision)
            command = hop if isinstance(hop, CallModel) else await self._run(hop)

    async def _run(self, check: Any) -> CallModel | ApprovalRequested:
        batch = await self.gate.check(check)
        return await execute(batch, self.batches, self.runner, max_transcript_bytes=self.settings.max_transcript_bytes)

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
