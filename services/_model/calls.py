"""Model service: one CallModel command in, one ModelResponded iteration event out.

It asks the turn's fence first: no model call for a turn that has ended, been cancelled, moved on or passed its
deadline. Whatever the model returns, the event stays under the broker's message limit (wire/limits.py): a tool input
too large or too deep becomes a marker and its call an error the loop goes on from; the call is billed either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anthropic
from opentelemetry import trace

from roundtrip._kernel.observability import metrics
from roundtrip._kernel.wire.events import CallModel, ModelResponded, ToolCall, Turn, Usage
from roundtrip._kernel.wire.fingerprints import fingerprint
from roundtrip._kernel.wire.limits import cap_text, fit_transcript, input_problem, json_size, omitted
from roundtrip._model.attempts import Tried, attempt
from roundtrip._model.capacity import Capacity
from roundtrip._model.observed import observe
from roundtrip._model.port import CallOptions, Model
from roundtrip._model.streamed import Chunks

log = logging.getLogger("roundtrip.model")


class Limits:
    def __init__(self, block_bytes: int, input_depth: int, transcript_bytes: int) -> None:
        self.block_bytes, self.input_depth, self.transcript_bytes = block_bytes, input_depth, transcript_bytes


class ModelFence(Protocol):
    """What a model call asks the turn's fence (turnstore.Fence; roundtrip.testing's OpenFence in one process)."""

    async def claim_model_call(self, turn: Turn, step: int, now: float) -> bool: ...

    async def wait_for_capacity(self, turn: Turn, step: int, now: float) -> bool: ...


def usage_of(message: anthropic.types.Message) -> Usage:
    u = message.usage
    return Usage(
        input_tokens=u.input_tokens or 0,
        output_tokens=u.output_tokens or 0,
        cache_creation_input_tokens=u.cache_creation_input_tokens or 0,
        cache_read_input_tokens=u.cache_read_input_tokens or 0,
    )


def _blocks(message: anthropic.types.Message, limits: Limits) -> tuple[list[dict[str, Any]], list[ToolCall]]:
    """The response's content as plain blocks and its tool calls, within the size policy."""
    content: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    for block in message.content:
        if block.type == "tool_use":
            problem = input_problem(block.input, limits.block_bytes, limits.input_depth)
            tool_input = omitted(problem) if problem else block.input
            if problem:
                log.warning("tool_use %s (%s): %s", block.id, str(block.name)[:80], problem)
                trace.get_current_span().add_event(
                    "tool input not kept", {"roundtrip.tool_use_id": block.id, "roundtrip.reason": problem}
                )
            content.append({"type": "tool_use", "id": block.id, "name": block.name, "input": tool_input})
            calls.append(
                ToolCall(
                    id=block.id,
                    name=block.name,
                    input=tool_input,
                    fingerprint=fingerprint(block.name, tool_input),
                    error=problem,
                )
            )
        elif block.type == "text":
            content.append({"type": "text", "text": cap_text(block.text, limits.block_bytes)})
        else:
            content.append(block.model_dump(mode="json", exclude_none=True))
    return content, calls


@dataclass(frozen=True)
class Retrying:
    """How a call is retried (attempts.py): the limiter, the transient retries, the default deadline, capacity waits
    (off in a plain loop around the SDK: a capacity refusal is the call's error at once)."""

    capacity: Capacity
    retries: int
    deadline_s: float
    wait_for_capacity: bool


def _caller(command: CallModel, client: Model, chunks: Chunks | None) -> Callable[[int], Awaitable[Any]]:
    turn = command.turn

    async def call(n: int) -> tuple[Any, Any]:
        options = CallOptions(turn.persona, turn.disable_parallel_tool_use, n)
        if chunks is not None:
            chunks.begin()
            return await client.stream_answer(command.messages, options, chunks)
        return await client.answer(command.messages, options)

    return call


def _stream_ended(chunks: Chunks | None, out: Tried) -> None:
    """The step's stream: final when the call was answered, else cut."""
    if chunks is not None:
        if out.message is not None and not out.error:
            chunks.end(out.message.stop_reason)
        else:
            chunks.cut()


async def call_model(
    command: CallModel, client: Model, fence: ModelFence, limits: Limits, retrying: Retrying, chunks: Chunks | None
) -> ModelResponded | None:
    """The next iteration of the turn, or None when the fence refuses the call; streamed with `chunks` (None: not)."""
    turn = command.turn
    if not await fence.claim_model_call(turn, command.step, time.time()):
        trace.get_current_span().add_event(
            "model not called: the turn has ended or moved on", {"roundtrip.step": command.step}
        )
        return None
    step = command.step + 1
    started = time.perf_counter()
    out = await _attempted(command, client, fence, retrying, chunks)
    observe(out, retrying.capacity)
    _stream_ended(chunks, out)
    if out.gone:
        return None
    if out.error:
        metrics.model_call_duration.labels(client.model, "error").observe(time.perf_counter() - started)
        return ModelResponded(
            turn=turn,
            step=step,
            messages=command.messages,
            spent=command.spent,
            model=client.model,
            error=out.error,
            busy=out.busy,
        )
    message = out.message
    metrics.model_call_duration.labels(client.model, "ok").observe(time.perf_counter() - started)
    return responded(command, message, step, limits)


async def _attempted(
    command: CallModel, client: Model, fence: ModelFence, retrying: Retrying, chunks: Chunks | None
) -> Tried:
    turn = command.turn

    async def waiting() -> bool:
        trace.get_current_span().add_event("waiting for model capacity", {"roundtrip.step": command.step})
        return await fence.wait_for_capacity(turn, command.step, time.time())

    return await attempt(
        _caller(command, client, chunks),
        retrying.capacity,
        turn.deadline_at or time.time() + retrying.deadline_s,
        retrying.retries,
        waiting,
        retrying.wait_for_capacity,
    )


def responded(command: CallModel, message: Any, step: int, limits: Limits) -> ModelResponded:
    """The iteration event of a model's answer: its blocks and tool calls, the transcript fitted to its limit."""
    usage = usage_of(message)  # billed whatever the content: counted before anything else can go wrong
    try:
        content, calls = _blocks(message, limits)
        messages, replaced = fit_transcript(command.messages, max(0, limits.transcript_bytes - json_size(content)))
    except Exception as exc:  # a response we cannot carry still ends the turn with its cost counted
        log.exception("turn %s step %d: the model's response could not be processed", command.turn.turn_id, step)
        return ModelResponded(
            turn=command.turn,
            step=step,
            messages=command.messages,
            usage=usage,
            spent=command.spent + usage,
            model=message.model,
            error=f"the model's response could not be processed ({type(exc).__name__})",
        )
    if replaced:
        log.warning(
            "turn %s step %d: %d large blocks of the transcript replaced by markers",
            command.turn.turn_id,
            step,
            replaced,
        )
    return ModelResponded(
        turn=command.turn,
        step=step,
        messages=messages,
        content=content,
        stop_reason=message.stop_reason,
        tool_calls=calls,
        usage=usage,
        spent=command.spent + usage,
        model=message.model,
    )
