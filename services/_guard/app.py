"""The guard service: turn.starts, turn.iterations, turn.controls -> turn.model_calls | turn.tool_calls | turn.outcomes.

Also the approvals (turn.approval_requests, turn.approval_decisions) and the sweep for stuck turns (turn.events).
Each subscription goes to its part of the guard's core (services/_guard/core.py), in a span of its own; the stores
open at start, then the outbox an earlier run left is published and the sweeper runs (`shell.runs`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from faststream import FastStream
from pydantic import BaseModel

from roundtrip._guard import retention, sweeper
from roundtrip._guard.conversations import Conversations
from roundtrip._guard.core import Guard, GuardPorts, core_of
from roundtrip._guard.ledger import Ledger
from roundtrip._kernel.observability.telemetry import tracer
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.shell import Shell
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.events import ApprovalDecided, ApprovalRequested, CancelTurn, ModelResponded, StartTurn
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.guard")


async def traced(
    name: str, turn_id: str, handle: Callable[[], Awaitable[str]], attributes: dict[str, Any] | None = None
) -> None:
    """A handler in a span of its own, with what the guard answered."""
    with tracer().start_as_current_span(name) as span:
        span.set_attributes({"roundtrip.turn_id": turn_id, **(attributes or {})})
        span.set_attribute("roundtrip.result", await handle())


def subscribe_handlers(shell: Shell, guard: Callable[[], Guard]) -> None:
    """Each input the topology declares for the guard, to its part; `guard()` is the guard of the running app."""

    @shell.subscribe(topics.TURN_STARTS, role="starts")
    async def on_start_turn(command: StartTurn) -> None:
        await traced("guard.start", command.turn.turn_id, lambda: guard().starts.on_start(command))

    @shell.subscribe(topics.ITERATIONS)
    async def on_iteration(event: ModelResponded) -> None:
        await traced(
            "guard.decide",
            event.turn.turn_id,
            lambda: guard().loop.on_iteration(event),
            {
                "roundtrip.step": event.step,
                "roundtrip.stop_reason": event.stop_reason or "",
                "roundtrip.fingerprints": [c.fingerprint for c in event.tool_calls],
            },
        )

    @shell.subscribe(topics.TURN_CONTROLS, role="controls")
    async def on_cancel_turn(command: CancelTurn) -> None:
        await traced("guard.cancel", command.turn_id, lambda: guard().external_ends.on_cancel(command))

    @shell.subscribe(topics.APPROVAL_REQUESTS, role="approvals")
    async def on_approval_requested(event: ApprovalRequested) -> None:
        await traced("guard.await_approval", event.turn.turn_id, lambda: guard().approvals.on_requested(event))

    @shell.subscribe(
        topics.APPROVAL_DECISIONS,
        role="decisions",
        description="A person's signed decision on a waiting call (ApprovalDecided); a forged one, one for another "
        "call or for a turn that has ended is dead-lettered with the reason",
    )
    async def on_approval_decided(decision: ApprovalDecided) -> None:
        await traced("guard.decision", decision.turn_id, lambda: guard().approvals.on_decision(decision))


async def republish_left_over(guard: Guard) -> None:
    """Decisions recorded before a crash but never published go out at start-up, not on some redelivery."""
    try:
        if republished := await guard.outbox.republish_all(older_than=time.time()):
            log.warning("republished %d decisions left unpublished by an earlier run", republished)
    except Exception:  # the sweeper retries
        log.exception("republishing the outbox at start-up failed; the sweeper retries")


async def preflight(settings: Settings) -> None:
    """Asked by `roundtrip run guard` before it builds: the ledger's retention must outlast what a redelivery can
    still bring (RetentionTooShort)."""
    retention.check_outlasts(settings.ledger_retention_s, await retention.requests_retention_ms(settings))


def build(settings: Settings, agent: Agent) -> FastStream:
    shell = Shell("guard", settings, log, agent.digest, agent.holds_calls())
    outlets = {topic: shell.outlet(topic, model) for topic, model in topology.service("guard").outputs.items()}

    async def publish(topic: str, message: BaseModel, conversation_id: str) -> None:
        await outlets[topic](message, conversation_id)

    async def open_guard() -> Guard:
        ledger = await Ledger.open(settings.ledger_db_url, pool_size=settings.database_pool_size)
        conversations = await Conversations.open(
            settings.conversations_db_url,
            settings.history_tokens,
            settings.conversation_retention_s,
            pool_size=settings.database_pool_size,
        )
        return core_of(settings, agent, GuardPorts(ledger, conversations, publish))

    guard = shell.opens("the guard", open_guard, Guard.close)

    async def sweeping() -> None:
        """The outbox an earlier run left, then the sweep for stuck turns and the ledger's retention, until stopped."""
        await republish_left_over(guard())
        await asyncio.gather(
            sweeper.run(guard().sweeper, outlets[topics.TURN_EVENTS], settings.sweep_interval_s, guard().conversations),
            retention.run(retention.Retention(guard().ledger, settings.ledger_retention_s), settings.sweep_interval_s),
        )

    shell.runs(sweeping)
    subscribe_handlers(shell, guard)
    return shell.app
