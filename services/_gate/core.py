"""The gate's core: one CheckToolCalls in, the signed ExecuteToolBatch of its step out.

Built once by `core_of`, run by the service's shell (app.py) per message of turn.tool_calls and by roundtrip.testing's
in-process loop per step: the agent's tools, resolvers, policies and wording, with the deployment's keys; the turns the
ledger recorded and the agent's dependencies come in its ports.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import SecretStr

from roundtrip._gate.gate import Gate
from roundtrip._kernel.wire.approvals import DecisionVerifier, Signer
from roundtrip._kernel.wire.events import CheckToolCalls, ExecuteToolBatch, Turn
from roundtrip._sdk.agent import Agent
from roundtrip._sdk.context import Dependencies, ToolContext

log = logging.getLogger("roundtrip.gate")


class GateConfig(Protocol):
    """The settings the gate reads: its signing key, the approvals' verify keys and timeout, a batch's time to live."""

    batch_signing_key: SecretStr
    decision_verify_keys: str
    approval_timeout_s: float
    stuck_after_s: float


class Recorded(Protocol):
    """The turns as their starts recorded them (recorded.RecordedTurns on the ledger in the fleet)."""

    async def authorized(self, turn: Turn) -> Turn: ...


@dataclass(frozen=True)
class GatePorts:
    turns: Recorded
    deps: Dependencies  # the agent's clients, opened by the shell (or the in-process loop)


class GateCore:
    def __init__(self, gate: Gate, turns: Recorded) -> None:
        self.gate, self.turns = gate, turns

    async def handle(self, command: CheckToolCalls) -> ExecuteToolBatch:
        """The step's batch, signed: checked for the turn the ledger recorded at its start (a copy naming anyone else
        is refused here, raising)."""
        turn = await self.turns.authorized(command.turn)
        batch = await self.gate.check(command.model_copy(update={"turn": turn}))
        rejected = [c.name for c in batch.calls if not c.approved]
        if rejected:
            log.info("turn %s step %d: rejected %s", command.turn.turn_id, command.step, rejected)
        return batch


def gate_for(agent: Agent, settings: GateConfig, deps: Dependencies) -> Gate:
    """The gate of this agent, with these clients: its look-ups are the agent's resolvers, scoped to the principal."""
    registry = agent.registry

    async def lookup(kind: str, entity_id: str, customer_id: str) -> dict[str, Any] | None:
        ctx = ToolContext(customer_id=customer_id, tool_use_id="", idempotency_key="", deps=deps)
        return await registry.entity_resolver(kind)(entity_id, ctx)

    return Gate(
        registry=registry,
        lookup=lookup,
        signer=Signer.of(settings.batch_signing_key.get_secret_value(), "ROUNDTRIP_BATCH_SIGNING_KEY"),
        deps=deps,
        batch_ttl_s=settings.stuck_after_s,
        agent_settings=agent.own_settings,
        messages=agent.message,
        unavailable=agent.toolbox.unavailable,
        decisions=DecisionVerifier.of(settings.decision_verify_keys, "ROUNDTRIP_DECISION_VERIFY_KEYS"),
        approval_timeout_s=settings.approval_timeout_s,
    )


def core_of(settings: GateConfig, agent: Agent, ports: GatePorts) -> GateCore:
    return GateCore(gate_for(agent, settings, ports.deps), ports.turns)
