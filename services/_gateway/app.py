"""The gateway service: support.requests -> turn.starts, turn.outcomes -> support.replies."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import TopicPartition
from faststream import FastStream

from roundtrip._gateway.admission import Admission
from roundtrip._gateway.intake import SeenRequests, UnknownFields, check_key, refuser
from roundtrip._gateway.replied import RepliedTurns
from roundtrip._gateway.throttle import Throttle
from roundtrip._gateway.turns import reply_for, start_turn
from roundtrip._kernel.kafka.clients import kafka_clients
from roundtrip._kernel.kafka.messaging import Outlet, current_record, group, key_of
from roundtrip._kernel.kafka.transactions import TransactionalOutlet, transactional_id
from roundtrip._kernel.observability.telemetry import (
    PROVIDER_NAMES,
    bind_turn,
    new_turn_ids,
    record_turn_span,
    tracer,
)
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.shell import Shell
from roundtrip._kernel.storage.turnstore import TurnStore
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import StartTurn, SupportReply, SupportRequest, TurnEnded
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.gateway")


def build(settings: Settings, agent: Agent) -> FastStream:
    shell = Shell("gateway", settings, log, turn_roots=(topics.SUPPORT_REQUESTS,), agent_digest=agent.digest)
    admission = Admission(
        settings.max_running_turns, forget_after_s=settings.turn_deadline_s + settings.stuck_grace_s + 60
    )
    start = shell.outlet(topics.TURN_STARTS, StartTurn)
    refusals = shell.outlet(topics.SUPPORT_REPLIES, SupportReply)
    replies_topic = shell.topic(topics.SUPPORT_REPLIES)
    kafka = kafka_clients(settings)
    replies = TransactionalOutlet(
        kafka,
        replies_topic,
        group("gateway", "replies", settings.topic_prefix),
        transactional_id("gateway", topics.SUPPORT_REPLIES, settings.instance_id, settings.topic_prefix),
    )
    # which turns have their reply: this process's, and what support.replies says after a start or a rebalance
    replied = RepliedTurns(kafka, replies_topic, settings.reply_memory_s)
    subscribe_requests(shell, admission, start, refusals)
    subscribe_outcomes(shell, agent, admission, replies, replied)
    shell.app.on_startup(replies.start)
    shell.closes(replies.stop)
    # admit fewer new turns while running turns wait for the model's capacity (services/_gateway/throttle.py)
    shell.opens("the admission throttle", lambda: _throttled(admission, settings), _unthrottled)
    return shell.app


Throttled = tuple[TurnStore, "asyncio.Task[None]"]


async def _throttled(admission: Admission, settings: Settings) -> Throttled | None:
    try:
        store = await TurnStore.open(settings.ledger_db_url, read_only=True)
    except Exception as exc:  # noqa: BLE001 - the gateway runs without the signal rather than not at all
        log.warning(
            "the turn ledger cannot be read (%s: %s): admission will not follow the model's capacity",
            type(exc).__name__,
            exc,
        )
        return None
    return store, asyncio.create_task(Throttle(admission, store).run(), name="gateway-throttle")


async def _unthrottled(throttled: Throttled) -> None:
    store, task = throttled
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await store.close()


def subscribe_requests(shell: Shell, admission: Admission, start: Outlet, refusals: Outlet) -> None:
    """support.requests -> turn.starts: each request starts its turn once, when the fleet admits it."""
    started, unknown = SeenRequests(memory_s=shell.settings.reply_memory_s), UnknownFields()

    # a request waiting for admission holds nothing but its place: a rebalance or a stop may interrupt it
    @shell.subscribe(topics.SUPPORT_REQUESTS, cancel_on_revoke=True, on_failure=refuser(refusals))
    async def on_support_request(request: SupportRequest) -> None:
        unknown.note(request)
        check_key(request, current_record().key)
        command = start_turn(request, *new_turn_ids())
        turn = command.turn
        bind_turn(turn.turn_id)
        with tracer().start_as_current_span("turn.start") as span:
            span.set_attributes({"roundtrip.turn_id": turn.turn_id, "roundtrip.customer_id": turn.customer_id})
            if not started.add(turn.turn_id, request):
                span.add_event("duplicate request dropped")
                log.info("duplicate request %r (turn %r) dropped", request.request_id, turn.turn_id)
                return
            waited = await admission.admit(turn.turn_id)
            if waited > 0.001:
                span.set_attribute("roundtrip.admission_wait_s", round(waited, 3))
            log.info("turn %r started for %r (trace %s)", turn.turn_id, turn.customer_id, turn.trace_id)
            await start(command, turn.conversation_id)


def subscribe_outcomes(
    shell: Shell,
    agent: Agent,
    admission: Admission,
    replies: TransactionalOutlet,
    replied: RepliedTurns,
) -> None:
    """turn.outcomes -> support.replies: the one reply of each turn, committed with the offsets of its outcome in
    one transaction (services/_kernel/kafka/transactions.py)."""

    async def commit(offsets: dict[TopicPartition, int]) -> None:
        await replies.commit(offsets)
        replied.committed_up_to(offsets)

    def forget(partitions: list[TopicPartition]) -> None:
        replies.forget(partitions)
        replied.forget(partitions)

    settings = shell.settings

    @shell.subscribe(topics.OUTCOMES, role="replies", commit=commit, forget=forget, commit_interval_s=0)
    async def on_turn_ended(ended: TurnEnded) -> None:
        admission.release(ended.turn.turn_id)
        with tracer().start_as_current_span("turn.reply") as span:
            span.set_attributes({"roundtrip.turn_id": ended.turn.turn_id, "roundtrip.outcome": ended.outcome.value})
            raw = current_record()
            if not await replied.claim(ended.turn.turn_id, TopicPartition(raw.topic, raw.partition), raw.offset):
                span.add_event("duplicate outcome dropped")
                return
            record_turn_span(
                ended.turn,
                outcome=ended.outcome.value,
                steps=ended.step,
                usage=ended.spent,
                cost_usd=ended.cost_usd,
                agent_name=agent.name,
                agent_digest=agent.digest,
                model=agent.model_for(settings),
                provider=PROVIDER_NAMES[settings.model_provider],
            )
            # the reply becomes visible with the commit of this message's offset: no second reply after a crash
            replies.stage(reply_for(ended), key_of(ended.turn.conversation_id), raw)
