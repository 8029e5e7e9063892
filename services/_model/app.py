"""The model service: turn.model_calls -> (Messages API) -> turn.iterations, and support.stream as text comes.

One limiter per process paces every call; while it is at its limit the consumer of turn.model_calls is held
back, so the waiting work is lag on that topic (`roundtrip lag`, KEDA)."""

from __future__ import annotations

import functools
import logging
import time

from faststream import FastStream

from roundtrip._kernel.kafka.consumer import KeyOrderedConsumer
from roundtrip._kernel.kafka.messaging import current_record
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.shell import Shell
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import CallModel, ModelResponded, StreamedText
from roundtrip._model import providers
from roundtrip._model.calls import Limits, Retrying, call_model
from roundtrip._model.capacity import Capacity
from roundtrip._model.client import ModelClient
from roundtrip._model.streamed import Chunks, Send
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.model")


def chunks_for(command: CallModel, settings: Settings, send: Send, started_at: float) -> Chunks | None:
    """The chunks of a streaming turn's text; a call published before this process started may be a redelivery."""
    if not (settings.stream_replies if command.turn.stream is None else command.turn.stream):
        return None
    chunks = Chunks(command.turn, command.step + 1, send, settings.stream_chunk_ms / 1000, settings.stream_chunk_chars)
    record = current_record()
    if record is not None and record.timestamp / 1000 < started_at:
        chunks.cut_earlier()
    return chunks


def build(settings: Settings, agent: Agent) -> FastStream:
    shell = Shell("model", settings, log, agent_digest=agent.digest)
    responded = shell.outlet(topics.ITERATIONS, ModelResponded)
    streamed = shell.outlet(topics.SUPPORT_STREAM, StreamedText)
    started_at = time.time()  # a call published before this: perhaps a redelivery of one streamed by a dead process
    client = ModelClient(settings, agent.toolbox.api_tools, agent.system_prompt, agent.model_for(settings))
    limits = Limits(settings.max_block_bytes, settings.max_input_depth, settings.max_transcript_bytes)
    capacity = Capacity(
        on_throttle=functools.partial(_hold_all, shell.consumers), signals=providers.of(settings).signals
    )
    retrying = Retrying(capacity, settings.model_max_retries, settings.turn_deadline_s)
    metrics.model_waiting.set_function(lambda: capacity.waiting)

    @shell.subscribe(topics.MODEL_CALLS)
    async def on_call_model(command: CallModel) -> None:
        chunks = chunks_for(command, settings, streamed, started_at)
        try:
            await answered(command, await call_model(command, client, fence(), limits, retrying, chunks))
        finally:
            if chunks is not None:  # the step's text acknowledged beside its iteration event, before the commit
                await chunks.sent()

    async def answered(command: CallModel, event: ModelResponded | None) -> None:
        if event is None:
            log.warning(
                "turn %s step %d: model not called: the turn has ended, been cancelled, moved on or passed its "
                "deadline",
                command.turn.turn_id,
                command.step,
            )
            return
        if event.error:
            log.warning("turn %s step %d: model call failed: %s", command.turn.turn_id, event.step, event.error)
        await responded(event, command.turn.conversation_id)

    app = shell.app
    agent.toolbox.run_with(app)
    shell.closes(client.aclose)
    fence = shell.fence()
    return app


def _hold_all(consumers: list[KeyOrderedConsumer], throttled: bool) -> None:
    for consumer in consumers:
        consumer.hold(throttled)
