"""The gateway service: support.requests -> turn.starts, turn.outcomes -> support.replies.

An end is answered only when it is the one the guard recorded in the ledger (one read by key): anything that can
write turn.outcomes could otherwise speak to any customer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from aiokafka import TopicPartition
from faststream import FastStream

from roundtrip._gateway.admission import Admission
from roundtrip._gateway.intake import SeenRequests, UnknownFields, check_key, refuser
from roundtrip._gateway.replied import RepliedTurns
from roundtrip._gateway.throttle import Throttle
from roundtrip._gateway.turns import forged, reply_for, start_turn
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
from roundtrip._kernel.storage.turnstore import NO_SUCH_TURN, TurnStore, refused
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import StartTurn, SupportReply, SupportRequest, TurnEnded
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.gateway")


def build(settings: Settings, agent: Agent) -> FastStream:
    shell = Shell("gateway", settings, log, agent.digest, agent.holds_calls(), turn_roots=(topics.SUPPORT_REQUESTS,))
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
    # read only: each end is checked against it; admission follows the model's capacity (throttle.py)
    ledger = shell.opens("the turn ledger", lambda: _throttled(admission, settings), _unthrottled)
    subscribe_requests(shell, admission, start, refusals)
    subscribe_outcomes(shell, agent, admission, replies, replied, lambda: ledger()[0])
    shell.app.on_startup(replies.start)
    shell.closes(replies.stop)
    return shell.app


Throttled = tuple[TurnStore, "asyncio.Task[None]"]


async def _throttled(admission: Admission, settings: Settings) -> Throttled:
    store = await TurnStore.open(settings.ledger_db_url, read_only=True)
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
    ledger: Callable[[], TurnStore],
) -> None:
    """turn.outcomes -> support.replies: the one reply of each turn, committed with the offsets of its outcome in
    one transaction (services/_kernel/kafka/transactions.py). An end the ledger did not record is refused
    (dead-lettered, said on roundtrip.security); one of a turn retention deleted only when it was answered already."""

    async def commit(offsets: dict[TopicPartition, int]) -> None:
        await replies.commit(offsets)
        replied.committed_up_to(offsets)

    def forget(partitions: list[TopicPartition]) -> None:
        replies.forget(partitions)
        replied.forget(partitions)

    settings = shell.settings

    @shell.subscribe(topics.OUTCOMES, role="replies", commit=commit, forget=forget, commit_interval_s=0)
    async def on_turn_ended(ended: TurnEnded) -> None:
        turn_id = ended.turn.turn_id
        with tracer().start_as_current_span("turn.reply") as span:
            span.set_attributes({"roundtrip.turn_id": turn_id, "roundtrip.outcome": ended.outcome.value})
            why = forged(ended, await ledger().ended_as(turn_id), time.time(), settings.reply_memory_s)
            if why == NO_SUCH_TURN and await replied.answered(turn_id):
                span.add_event("duplicate outcome of a turn the ledger no longer has dropped")
                return
            if why is not None:
                raise refused(ended.turn, "gateway", f"end not sent: {why}")
            admission.release(turn_id)
            raw = current_record()
            if not await replied.claim(turn_id, TopicPartition(raw.topic, raw.partition), raw.offset):
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
