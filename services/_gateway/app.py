"""The gateway service: support.requests -> turn.starts, turn.outcomes -> support.replies.

An end is answered only when it is the one the guard recorded in the ledger (one read by key): anything that can
write turn.outcomes could otherwise speak to any customer. The core (core.py) decides both flows; the shell holds the
Kafka side: the transactional outlet of the replies, the offsets they commit with."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiokafka import TopicPartition
from faststream import FastStream

from roundtrip._gateway.admission import Admission, Lanes
from roundtrip._gateway.core import GatewayPorts, core_of
from roundtrip._gateway.intake import refuser
from roundtrip._gateway.replied import RepliedTurns
from roundtrip._gateway.throttle import Throttle
from roundtrip._kernel.kafka.clients import kafka_clients
from roundtrip._kernel.kafka.messaging import current_record, group, key_of
from roundtrip._kernel.kafka.transactions import TransactionalOutlet, transactional_id
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.shell import Opened, Shell
from roundtrip._kernel.storage.turnstore import TurnStore
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import StartTurn, SupportReply, SupportRequest, TurnEnded
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.gateway")


async def preflight(settings: Settings) -> None:
    """Asked by `roundtrip run gateway` before it builds: the default lane must be one the platform has."""
    settings.refuse_unavailable_lane("gateway")


def build(settings: Settings, agent: Agent) -> FastStream:
    shell = Shell("gateway", settings, log, agent.digest, agent.holds_calls(), turn_roots=(topics.SUPPORT_REQUESTS,))
    lanes = Lanes(
        Admission(settings.max_running_turns, forget_after_s=settings.turn_deadline_s + settings.stuck_grace_s + 60),
        Admission(
            settings.max_running_batch_turns, forget_after_s=settings.batch_deadline_s + settings.stuck_grace_s + 60
        ),
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
    shell.app.on_startup(replies.start)
    shell.closes(replies.stop)
    # which turns have their reply: this process's, and what support.replies says after a start or a rebalance
    replied = RepliedTurns(kafka, replies_topic, settings.reply_memory_s)
    # read only: each end is checked against it; admission follows the model's capacity (throttle.py)
    ledger = shell.opens("the turn ledger", lambda: _throttled(lanes, settings), _unthrottled)

    def stage(reply: SupportReply, conversation_id: str) -> None:
        replies.stage(reply, key_of(conversation_id), current_record())

    core = core_of(settings, agent, GatewayPorts(lanes, _OpenedEnds(ledger), replied, start, stage))

    # a request waiting for admission holds nothing but its place: a rebalance or a stop may interrupt it
    @shell.subscribe(topics.SUPPORT_REQUESTS, cancel_on_revoke=True, on_failure=refuser(refusals))
    async def on_support_request(request: SupportRequest) -> None:
        await core.start(request, current_record().key)

    async def commit(offsets: dict[TopicPartition, int]) -> None:
        await replies.commit(offsets)
        replied.committed_up_to(offsets)

    def forget(partitions: list[TopicPartition]) -> None:
        replies.forget(partitions)
        replied.forget(partitions)

    # the one reply of each turn, committed with the offsets of its outcome in one transaction
    # (services/_kernel/kafka/transactions.py)
    @shell.subscribe(topics.OUTCOMES, role="replies", commit=commit, forget=forget, commit_interval_s=0)
    async def on_turn_ended(ended: TurnEnded) -> None:
        raw = current_record()
        await core.reply(ended, TopicPartition(raw.topic, raw.partition), raw.offset)

    return shell.app


Throttled = tuple[TurnStore, "asyncio.Task[None]"]


class _OpenedEnds:
    """The ledger the core is built with before the shell opens it at start."""

    def __init__(self, opened: Opened[Throttled]) -> None:
        self.opened = opened

    async def ended_as(self, turn_id: str) -> Any:
        return await self.opened()[0].ended_as(turn_id)


async def _throttled(lanes: Lanes, settings: Settings) -> Throttled:
    store = await TurnStore.open(settings.ledger_db_url, read_only=True)
    return store, asyncio.create_task(Throttle(lanes, store).run(), name="gateway-throttle")


async def _unthrottled(throttled: Throttled) -> None:
    store, task = throttled
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await store.close()
