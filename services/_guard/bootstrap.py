"""The guard's core: its parts wired over one ledger, what its shell (app.py) opens at start or a caller drives.

The parts (starts, loop, approvals, external ends, sweeper, outbox) share the ledger, the outbox (so every
decision goes out the same way), the conversation store and the step clock; nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping

from roundtrip._guard.approvals import Approvals
from roundtrip._guard.conversations import Conversations
from roundtrip._guard.external_ends import Outside
from roundtrip._guard.ledger import Ledger
from roundtrip._guard.loop import Loop, StepClock
from roundtrip._guard.outbox import Outbox, Publish
from roundtrip._guard.rules import Policy
from roundtrip._guard.side_effects import Acts
from roundtrip._guard.starts import ConversationOrder, Starts
from roundtrip._guard.sweeper import Sweeper
from roundtrip._kernel.storage.prices import PriceTable
from roundtrip._kernel.wire.approvals import DecisionVerifier, Verifier


class Guard:
    """The guard's parts, wired. None refuses: `decisions` every person's decision, `holds` every approval
    request; `conversations` None: every request stands alone; `acts` None: no tool counts as a side effect."""

    def __init__(
        self,
        ledger: Ledger,
        policy: Policy,
        prices: PriceTable,
        publish: Publish,
        *,
        model: str = "",
        stuck_after_s: float = 60.0,
        stuck_grace_s: float = 30.0,
        turn_deadline_s: float = 300.0,
        outbox_after_s: float = 5.0,
        conversations: Conversations | None = None,
        wait_poll_s: float = 0.5,
        decisions: DecisionVerifier | None = None,
        holds: Verifier | None = None,
        agent_digest: str | None = None,
        acts: Acts | None = None,
        progress: Mapping[str, str] | None = None,
        streams_by_default: bool = False,
    ) -> None:
        steps = StepClock()
        # a start waiting for its conversation's running turn gives up past the longest a turn can live
        order = ConversationOrder(ledger, give_up_after_s=turn_deadline_s + stuck_grace_s + 60, poll_s=wait_poll_s)
        self.ledger, self.conversations = ledger, conversations
        self.outbox = Outbox(
            ledger,
            publish,
            outbox_after_s,
            on_ended=order.ended,
            progress=progress,
            streams_by_default=streams_by_default,
        )
        self.starts = Starts(
            ledger, self.outbox, order, policy.replies, turn_deadline_s, conversations, steps, agent_digest
        )
        acts = acts or Acts(frozenset(), None, policy.replies)
        self.loop = Loop(ledger, self.outbox, policy, prices, model, conversations, steps, acts=acts)
        self.outside = Outside(ledger, self.outbox, conversations, steps, acts=acts)
        self.approvals = Approvals(ledger, self.outbox, self.outside, decisions, steps, holds)
        self.sweeper = Sweeper(
            ledger, self.outbox, self.outside, self.approvals, stuck_after_s, stuck_grace_s, turn_deadline_s
        )

    async def close(self) -> None:
        """Wait for the pending-copy clean-ups, then close the stores."""
        await self.outbox.drain()
        await self.ledger.close()
        if self.conversations is not None:
            await self.conversations.close()
