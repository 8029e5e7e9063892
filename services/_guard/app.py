"""The guard service: turn.starts, turn.iterations, turn.controls -> turn.model_calls | turn.tool_calls | turn.outcomes.

Also records calls waiting for a person (turn.approval_requests) and resumes their turns on a
signed decision (turn.approval_decisions).

Also sweeps the ledger for stuck turns (a timer, not a busy loop) and announces them on turn.events.

This module only wires: each subscription to its part of the guard (services/_guard/bootstrap.py
names them), in a span of its own; the outlets are the topology's outputs of the guard; the
stores open at start-up, the outbox left by an earlier run is published, then the sweeper runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from faststream import FastStream
from faststream.kafka import KafkaBroker
from pydantic import BaseModel

from roundtrip._guard import retention, sweeper
from roundtrip._guard.bootstrap import Guard
from roundtrip._guard.conversations import Conversations
from roundtrip._guard.ledger import Ledger
from roundtrip._guard.outbox import Publish
from roundtrip._guard.pricing import PriceTable
from roundtrip._guard.replies import Replies
from roundtrip._guard.rules import policy_from
from roundtrip._guard.side_effects import Acts
from roundtrip._kernel.kafka.messaging import Outlet, make_broker, service_app, subscribe
from roundtrip._kernel.observability.telemetry import tracer
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.approvals import DecisionVerifier, Verifier
from roundtrip._kernel.wire.events import ApprovalDecided, ApprovalRequested, CancelTurn, ModelResponded, StartTurn
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.guard")


def guard_of(
    settings: Settings, ledger: Ledger, conversations: Conversations, prices: PriceTable, publish: Publish, agent: Agent
) -> Guard:
    words = Replies.of(agent.replies, agent.acted_replies)  # the agent's own words when the fleet ends a turn
    shown = {name: tuple(spec.entity_refs) for name, spec in agent.registry.specs.items()}
    return Guard(
        ledger,
        policy_from(settings, words),
        prices,
        publish,
        model=agent.model_for(settings),
        agent_digest=agent.digest,
        stuck_after_s=settings.stuck_after_s,
        stuck_grace_s=settings.stuck_grace_s,
        turn_deadline_s=settings.turn_deadline_s,
        outbox_after_s=settings.outbox_after_s,
        conversations=conversations,
        decisions=DecisionVerifier.of(settings.decision_verify_keys, "ROUNDTRIP_DECISION_VERIFY_KEYS"),
        holds=Verifier.of(settings.batch_verify_keys, "ROUNDTRIP_BATCH_VERIFY_KEYS"),
        acts=Acts(frozenset(agent.serial), agent.describe_action, words, shown),
        progress=agent.progress,  # the customer's words for what a step's tools do (support.status)
        streams_by_default=settings.stream_replies,
    )


async def traced(
    name: str, turn_id: str, handle: Callable[[], Awaitable[str]], attributes: dict[str, Any] | None = None
) -> None:
    """A handler in a span of its own: the turn, what the message says (`attributes`), what the guard answered."""
    with tracer().start_as_current_span(name) as span:
        span.set_attributes({"roundtrip.turn_id": turn_id, **(attributes or {})})
        span.set_attribute("roundtrip.result", await handle())


def subscribe_handlers(broker: KafkaBroker, settings: Settings, guard: Callable[[], Guard]) -> None:
    """Each input the topology declares for the guard, to its part; `guard()` is the guard of the running app."""

    @subscribe(broker, topics.TURN_STARTS, "guard", settings, role="starts")
    async def on_start_turn(command: StartTurn) -> None:
        await traced("guard.start", command.turn.turn_id, lambda: guard().starts.on_start(command))

    @subscribe(broker, topics.ITERATIONS, "guard", settings)
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

    @subscribe(broker, topics.TURN_CONTROLS, "guard", settings, role="controls")
    async def on_cancel_turn(command: CancelTurn) -> None:
        await traced("guard.cancel", command.turn_id, lambda: guard().outside.on_cancel(command))

    @subscribe(broker, topics.APPROVAL_REQUESTS, "guard", settings, role="approvals")
    async def on_approval_requested(event: ApprovalRequested) -> None:
        await traced("guard.await_approval", event.turn.turn_id, lambda: guard().approvals.on_requested(event))

    @subscribe(
        broker,
        topics.APPROVAL_DECISIONS,
        "guard",
        settings,
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
    """`roundtrip run guard` asks this before it builds the guard: ended turns are deleted after their retention, which
    must outlast the requests a redelivery can still bring (RetentionTooShort: it refuses to start, in one line)."""
    retention.check_outlasts(settings.ledger_retention_s, await retention.requests_retention_ms(settings))


def build(settings: Settings, agent: Agent) -> FastStream:
    broker = make_broker("guard", settings)
    outlets = {topic: Outlet(broker, topic, model) for topic, model in topology.service("guard").outputs.items()}
    prices = PriceTable.from_json(settings.prices, settings.model_provider)
    state: dict[str, Any] = {}

    async def publish(topic: str, message: BaseModel, conversation_id: str) -> None:
        await outlets[topic](message, conversation_id)

    subscribe_handlers(broker, settings, lambda: state["guard"])
    app = service_app(broker, log)
    # its keys again (`roundtrip run` checked them before building): outside development, never a published one
    app.on_startup(lambda: settings.refuse_unfit_keys("guard", topology.service("guard").keys, agent.holds_calls()))

    @app.on_startup
    async def open_ledger() -> None:
        ledger = await Ledger.open(settings.ledger_db_url, pool_size=settings.database_pool_size)
        conversations = await Conversations.open(
            settings.conversations_db_url,
            settings.history_tokens,
            settings.conversation_retention_s,
            pool_size=settings.database_pool_size,
        )
        state["guard"] = guard_of(settings, ledger, conversations, prices, publish, agent)

    @app.after_startup
    async def start_sweeper() -> None:
        guard: Guard = state["guard"]
        await republish_left_over(guard)
        state["sweeper"] = asyncio.create_task(
            sweeper.run(guard.sweeper, outlets[topics.TURN_EVENTS], settings.sweep_interval_s, guard.conversations)
        )
        kept = retention.Retention(guard.ledger, settings.ledger_retention_s)
        state["retention"] = asyncio.create_task(retention.run(kept, settings.sweep_interval_s))

    @app.on_shutdown
    async def stop() -> None:
        for name in ("sweeper", "retention"):
            if task := state.pop(name, None):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    @app.after_shutdown
    async def close_ledger() -> None:
        await state["guard"].close()

    return app
