"""The model service's core: one CallModel in, its ModelResponded (or None: the fence refused it) out.

Built once by `core_of`, run by the service's shell (app.py) per message of turn.model_calls and by roundtrip.testing's
in-process loop per step; what it needs from outside comes in its ports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from roundtrip._kernel.wire.events import CallModel, ModelResponded
from roundtrip._model.calls import Limits, ModelFence, Retrying, call_model
from roundtrip._model.capacity import Capacity
from roundtrip._model.port import Model
from roundtrip._model.streamed import Chunks, Send


class ModelConcerns(Protocol):
    """The settings the model's core reads (ModelSettings, LoopRules and TranscriptLimits')."""

    model_max_retries: int
    turn_deadline_s: float
    stream_replies: bool
    stream_chunk_ms: float
    stream_chunk_chars: int
    max_block_bytes: int
    max_input_depth: int
    max_transcript_bytes: int


@dataclass(frozen=True)
class ModelPorts:
    """The model called, the turn fence, the limiter pacing every call of the process, whether a call waits for
    capacity (a plain loop around the SDK does not), and when this process started (a call published before it may be
    a redelivery of one a dead process streamed)."""

    model: Model
    fence: ModelFence
    capacity: Capacity
    wait_for_capacity: bool
    started_at: float


class ModelCore:
    def __init__(self, settings: ModelConcerns, ports: ModelPorts) -> None:
        self.model, self.fence, self.started_at = ports.model, ports.fence, ports.started_at
        self.limits = Limits(settings.max_block_bytes, settings.max_input_depth, settings.max_transcript_bytes)
        self.retrying = Retrying(
            ports.capacity, settings.model_max_retries, settings.turn_deadline_s, ports.wait_for_capacity
        )
        self.streams_by_default = settings.stream_replies
        self.chunk_s, self.chunk_chars = settings.stream_chunk_ms / 1000, settings.stream_chunk_chars

    def chunks_for(self, command: CallModel, send: Send, published_at: float | None) -> Chunks | None:
        """The chunks of a streaming turn's text (None: the turn does not stream); `published_at`: when the command
        was published (None: not known), before this process started meaning perhaps a redelivery."""
        if not (self.streams_by_default if command.turn.stream is None else command.turn.stream):
            return None
        chunks = Chunks(command.turn, command.step + 1, send, self.chunk_s, self.chunk_chars)
        if published_at is not None and published_at < self.started_at:
            chunks.cut_earlier()
        return chunks

    async def respond(self, command: CallModel, chunks: Chunks | None) -> ModelResponded | None:
        """The turn's next iteration, its text to `chunks` as it comes; None when the fence refuses the call."""
        return await call_model(command, self.model, self.fence, self.limits, self.retrying, chunks)


def core_of(settings: ModelConcerns, ports: ModelPorts) -> ModelCore:
    return ModelCore(settings, ports)
