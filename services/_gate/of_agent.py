"""The gate an agent's fleet runs: the agent's tools, resolvers, policies and wording, with the deployment's keys."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import SecretStr

from roundtrip._gate.gate import Gate
from roundtrip._kernel.wire.approvals import DecisionVerifier, Signer
from roundtrip._sdk.agent import Agent
from roundtrip._sdk.context import Dependencies, ToolContext


class GateConfig(Protocol):
    """The settings the gate reads: its signing key, the approvals' verify keys and timeout, a batch's time to live."""

    batch_signing_key: SecretStr
    decision_verify_keys: str
    approval_timeout_s: float
    stuck_after_s: float


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
