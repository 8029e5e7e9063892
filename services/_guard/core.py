"""The guard's core: its parts wired over one ledger, each handling one kind of message (starts, iterations, controls,
approval requests and decisions) and the sweep.

The parts (starts, loop, approvals, external ends, sweeper, outbox) share the ledger, the outbox (so every decision
goes out the same way), the conversation store and the step clock; nothing else. The loop's rules (`Decisions`) need
none of them: roundtrip.testing's in-process loop runs the same ones, built by the same `decisions_of`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from roundtrip._guard.approvals import Approvals
from roundtrip._guard.conversations import Conversations
from roundtrip._guard.external_ends import ExternalEnds
from roundtrip._guard.ledger import Ledger
from roundtrip._guard.loop import Decisions, Loop, StepClock
from roundtrip._guard.outbox import Outbox, Publish
from roundtrip._guard.replies import Replies
from roundtrip._guard.rules import policy_from
from roundtrip._guard.side_effects import SideEffects
from roundtrip._guard.starts import ConversationOrder, Starts
from roundtrip._guard.sweeper import Sweeper
from roundtrip._guard.versions import Ramp
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.prices import PriceTable
from roundtrip._kernel.wire.approvals import DecisionVerifier, Verifier
from roundtrip._sdk.agent import Agent

WAIT_POLL_S = 0.5  # how often a start waiting for its conversation's running turn looks again


@dataclass(frozen=True)
class GuardPorts:
    """The stores the shell opens at start and the outlet every decision goes out by."""

    ledger: Ledger
    conversations: Conversations | None  # None: every request stands alone (no conversation store)
    publish: Publish


@dataclass(frozen=True)
class Timing:
    """When a turn is flagged stuck, ended after that, ended at its deadline; when a decision left in the outbox is
    published again; how often a waiting start looks again."""

    stuck_after_s: float
    stuck_grace_s: float
    turn_deadline_s: float
    outbox_after_s: float
    wait_poll_s: float


class Guard:
    """The guard's parts, wired: `decisions` verifies people's decisions, `holds` the gate's signature of each hold."""

    def __init__(
        self,
        ports: GuardPorts,
        rules: Decisions,
        timing: Timing,
        decisions: DecisionVerifier,
        holds: Verifier,
        agent_digest: str,
        progress: Mapping[str, str],
        streams_by_default: bool,
    ) -> None:
        ledger, conversations, steps = ports.ledger, ports.conversations, StepClock()
        # a start waiting for its conversation's running turn gives up past the longest a turn can live
        give_up = timing.turn_deadline_s + timing.stuck_grace_s + 60
        order = ConversationOrder(ledger, give_up_after_s=give_up, poll_s=timing.wait_poll_s)
        self.ledger, self.conversations = ledger, conversations
        self.outbox = Outbox(
            ledger,
            ports.publish,
            timing.outbox_after_s,
            on_ended=order.ended,
            progress=progress,
            streams_by_default=streams_by_default,
        )
        replies = rules.policy.replies
        ramp = Ramp(ledger.shares)
        self.starts = Starts(
            ledger, self.outbox, order, replies, timing.turn_deadline_s, conversations, steps, agent_digest, ramp
        )
        self.loop = Loop(ledger, self.outbox, rules, conversations, steps)
        self.external_ends = ExternalEnds(ledger, self.outbox, conversations, steps, side_effects=rules.side_effects)
        self.approvals = Approvals(ledger, self.outbox, self.external_ends, decisions, steps, holds)
        self.sweeper = Sweeper(
            ledger,
            self.outbox,
            self.external_ends,
            self.approvals,
            timing.stuck_after_s,
            timing.stuck_grace_s,
            timing.turn_deadline_s,
        )

    async def close(self) -> None:
        """Wait for the pending-copy clean-ups, then close the stores."""
        await self.outbox.drain()
        await self.ledger.close()
        if self.conversations is not None:
            await self.conversations.close()


def decisions_of(settings: Settings, agent: Agent) -> Decisions:
    """The loop's rules for this agent: the fleet's limits, its prices, the agent's words and side effects."""
    words = Replies.of(agent.replies, agent.acted_replies)
    shown = {name: tuple(spec.entity_refs) for name, spec in agent.registry.specs.items()}
    return Decisions(
        policy_from(settings, words),
        PriceTable.from_json(settings.prices, settings.model_provider),
        agent.model_for(settings),
        SideEffects(frozenset(agent.serial), agent.describe_action, words, shown),
    )


def core_of(settings: Settings, agent: Agent, ports: GuardPorts) -> Guard:
    timing = Timing(
        settings.stuck_after_s, settings.stuck_grace_s, settings.turn_deadline_s, settings.outbox_after_s, WAIT_POLL_S
    )
    return Guard(
        ports,
        decisions_of(settings, agent),
        timing,
        DecisionVerifier.of(settings.decision_verify_keys, "ROUNDTRIP_DECISION_VERIFY_KEYS"),
        Verifier.of(settings.batch_verify_keys, "ROUNDTRIP_BATCH_VERIFY_KEYS"),
        agent.digest,
        agent.progress,
        settings.stream_replies,
    )
