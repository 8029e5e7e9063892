"""The guard service: turn.starts, turn.iterations, turn.controls -> turn.model_calls | turn.tool_calls | turn.outcomes.

Also records calls waiting for a person (turn.approval_requests) and resumes their turns on a
signed decision (turn.approval_decisions).

Also sweeps the ledger for stuck turns (a timer, not a busy loop) and announces them on turn.events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from faststream import FastStream
from pydantic import BaseModel

from services.guard.conversations import Conversations
from services.guard.handlers import Guard
from services.guard.ledger import Ledger
from services.guard.pricing import PriceTable
from services.guard.rules import Policy
from services.kernel import topics
from services.kernel.approvals import DecisionSigner, parse_keys
from services.kernel.events import (
    ApprovalDecided, ApprovalRequested, CallModel, CancelTurn, CheckToolCalls, ModelResponded, StartTurn, TurnEnded, TurnFlagged,
)
from services.kernel.messaging import Outlet, make_broker, service_app, subscribe
from services.kernel.settings import Settings
from services.kernel.telemetry import tracer

log = logging.getLogger("roundtrip.guard")


def policy_from(settings: Settings) -> Policy:
    return Policy(
        max_steps=settings.max_steps, loop_rules=settings.loop_rules, max_identical_calls=settings.max_identical_calls,
        cycle_max_period=settings.cycle_max_period, cycle_repeats=settings.cycle_repeats,
        failure_streak=settings.failure_streak, budget_usd=settings.turn_budget_usd,
    )


def build(settings: Settings) -> FastStream:
    broker = make_broker("guard", settings)
    outlets = {
        topics.MODEL_CALLS: Outlet(broker, topics.MODEL_CALLS, CallModel),
        topics.TOOL_CALLS: Outlet(broker, topics.TOOL_CALLS, CheckToolCalls),
        topics.OUTCOMES: Outlet(broker, topics.OUTCOMES, TurnEnded),
    }
    flagged = Outlet(broker, topics.TURN_EVENTS, TurnFlagged)
    prices = PriceTable.from_json(settings.prices)
    state: dict[str, Guard] = {}

    async def publish(topic: str, message: BaseModel, conversation_id: str) -> None:
        await outlets[topic](message, conversation_id)

    @subscribe(broker, topics.TURN_STARTS, "guard", settings, role="starts")
    async def on_start_turn(command: StartTurn) -> None:
        with tracer().start_as_current_span("guard.start") as span:
            span.set_attribute("roundtrip.turn_id", command.turn.turn_id)
            span.set_attribute("roundtrip.result", await state["guard"].on_start(command))

    @subscribe(broker, topics.ITERATIONS, "guard", settings)
    async def on_iteration(event: ModelResponded) -> None:
        with tracer().start_as_current_span("guard.decide") as span:
            span.set_attributes({
                "roundtrip.turn_id": event.turn.turn_id, "roundtrip.step": event.step,
                "roundtrip.stop_reason": event.stop_reason or "",
                "roundtrip.fingerprints": [c.fingerprint for c in event.tool_calls],
            })
            span.set_attribute("roundtrip.result", await state["guard"].on_iteration(event))

    @subscribe(broker, topics.TURN_CONTROLS, "guard", settings, role="controls")
    async def on_cancel_turn(command: CancelTurn) -> None:
        with tracer().start_as_current_span("guard.cancel") as span:
            span.set_attribute("roundtrip.turn_id", command.turn_id)
            span.set_attribute("roundtrip.result", await state["guard"].on_cancel(command))

    @subscribe(broker, topics.APPROVAL_REQUESTS, "guard", settings, role="approvals")
    async def on_approval_requested(event: ApprovalRequested) -> None:
        with tracer().start_as_current_span("guard.await_approval") as span:
            span.set_attribute("roundtrip.turn_id", event.turn.turn_id)
            span.set_attribute("roundtrip.result", await state["guard"].on_approval_requested(event))

    @subscribe(broker, topics.APPROVAL_DECISIONS, "guard", settings, role="decisions",
               description="A person's signed decision on a waiting call (ApprovalDecided); a forged one, one for another "
                           "call or for a turn that has ended is dead-lettered with the reason")
    async def on_approval_decided(decision: ApprovalDecided) -> None:
        with tracer().start_as_current_span("guard.decision") as span:
            span.set_attribute("roundtrip.turn_id", decision.turn_id)
            span.set_attribute("roundtrip.result", await state["guard"].on_decision(decision))

    async def sweeper() -> None:
        expired_at = 0.0
        while True:
            await asyncio.sleep(settings.sweep_interval_s)
            try:
                await state["guard"].sweep(flagged)
                if time.monotonic() - expired_at > 60:  # retention: conversations idle past it are deleted
                    expired_at = time.monotonic()
                    if expired := await state["guard"].conversations.expire():
                        log.info("deleted %d conversations idle for more than %g s", expired, settings.conversation_retention_s)
            except Exception:  # noqa: BLE001 - the sweeper must outlive a database hiccup
                log.exception("sweeping for stuck turns failed; will retry")

    app = service_app(broker, log)
    app.on_startup(lambda: settings.refuse_dev_decision_key("guard"))  # approvals on outside development: never the published key

    @app.on_startup
    async def open_ledger() -> None:
        ledger = await Ledger.open(settings.ledger_db_url)
        conversations = await Conversations.open(settings.conversations_db_url, settings.history_tokens,
                                                 settings.conversation_retention_s)
        state["guard"] = Guard(
            ledger=ledger, policy=policy_from(settings), prices=prices, publish=publish, model=settings.model,
            stuck_after_s=settings.stuck_after_s, stuck_grace_s=settings.stuck_grace_s, turn_deadline_s=settings.turn_deadline_s,
            outbox_after_s=settings.outbox_after_s, conversations=conversations,
            decisions=DecisionSigner(parse_keys(settings.decision_keys)),
        )

    @app.after_startup
    async def start_sweeper() -> None:
        try:  # decisions recorded before a crash but never published go out now, not on some redelivery
            republished = await state["guard"].republish_outbox(older_than=time.time())
            if republished:
                log.warning("republished %d decisions left unpublished by an earlier run", republished)
        except Exception:  # noqa: BLE001 - the sweeper retries
            log.exception("republishing the outbox at start-up failed; the sweeper retries")
        state["sweeper"] = asyncio.create_task(sweeper())

    @app.on_shutdown
    async def stop() -> None:
        task = state.pop("sweeper", None)
        if task:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @app.after_shutdown
    async def close_ledger() -> None:
        await state["guard"].drain()
        await state["guard"].ledger.close()
        await state["guard"].conversations.close()

    return app
