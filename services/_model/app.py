"""The model service: turn.model_calls -> (Messages API) -> turn.iterations, and support.stream as text comes.

One limiter per process paces every call; while it is at its limit the consumer of turn.model_calls is held
back, so the waiting work is lag on that topic (`roundtrip lag`, KEDA). The core (core.py) answers each call, the
batch lane (batches.py) a batch turn's."""

from __future__ import annotations

import functools
import logging
import random
import time

from faststream import FastStream

from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.kafka.consumer import KeyOrderedConsumer
from roundtrip._kernel.kafka.messaging import current_record
from roundtrip._kernel.kafka.transactions import instance_name
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.shell import OpenedFence, Shell
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import CallModel, ModelResponded, StreamedText
from roundtrip._model import providers
from roundtrip._model.batch_api import SdkBatches
from roundtrip._model.batch_store import BatchCalls
from roundtrip._model.batches import BatchPorts, lane_of
from roundtrip._model.capacity import Capacity
from roundtrip._model.client import ModelClient
from roundtrip._model.core import ModelPorts, core_of
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.model")


async def preflight(settings: Settings) -> None:
    """Asked by `roundtrip run model` before it builds: the default lane must be one the platform has."""
    settings.refuse_unavailable_lane("model")


def build(settings: Settings, agent: Agent) -> FastStream:
    shell = Shell("model", settings, log, agent.digest, agent.holds_calls())
    agent.toolbox.run_with(shell.app)  # the MCP tools, started before the handlers run
    responded = shell.outlet(topics.ITERATIONS, ModelResponded)
    streamed = shell.outlet(topics.SUPPORT_STREAM, StreamedText)
    client = ModelClient(settings, agent.toolbox.api_tools, agent.system_prompt, agent.model_for(settings), 0)
    shell.closes(client.aclose)
    fence = shell.fence()
    throttle = functools.partial(_hold_all, shell.consumers)
    capacity = Capacity(
        SYSTEM, random.Random(), slow_start=True, on_throttle=throttle, signals=providers.of(settings).signals
    )
    core = core_of(settings, ModelPorts(client, fence, capacity, True, time.time()))
    metrics.model_waiting.set_function(lambda: capacity.waiting)
    calls = shell.opens("the batch calls", lambda: _calls_beside(fence), BatchCalls.close)

    async def direct(command: CallModel) -> ModelResponded | None:  # a retry that cannot wait for a batch
        return await core.respond(command, None)

    ports = BatchPorts(
        client,
        SdkBatches(client.batches),
        calls,
        fence,
        direct,
        responded,
        instance_name("model", settings.instance_id),
        time.time,
    )
    lane = lane_of(settings, ports)
    batches = settings.batch_lane_available
    if batches:
        shell.runs(lane.run)

    @shell.subscribe(topics.MODEL_CALLS)
    async def on_call_model(command: CallModel) -> None:
        if batches and command.turn.lane == "batch":
            if not await lane.gather(command):
                _not_called(command)
            return
        record = current_record()
        chunks = core.chunks_for(command, streamed, None if record is None else record.timestamp / 1000)
        try:
            await answered(command, await core.respond(command, chunks))
        finally:
            if chunks is not None:  # the step's text acknowledged beside its iteration event, before the commit
                await chunks.sent()

    async def answered(command: CallModel, event: ModelResponded | None) -> None:
        if event is None:
            _not_called(command)
            return
        if event.error:
            log.warning("turn %s step %d: model call failed: %s", command.turn.turn_id, event.step, event.error)
        await responded(event, command.turn.conversation_id)

    return shell.app


async def _calls_beside(fence: OpenedFence) -> BatchCalls:
    return BatchCalls.beside(fence.opened())


def _not_called(command: CallModel) -> None:
    log.warning(
        "turn %s step %d: model not called: the turn has ended, been cancelled, moved on or passed its deadline",
        command.turn.turn_id,
        command.step,
    )


def _hold_all(consumers: list[KeyOrderedConsumer], throttled: bool) -> None:
    for consumer in consumers:
        consumer.hold(throttled)
