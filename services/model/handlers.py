"""Model service: one CallModel command in, one ModelResponded iteration event out."""

from __future__ import annotations

import time

import anthropic

from services.kernel import metrics
from services.kernel.events import CallModel, ModelResponded, ToolCall, Usage
from services.kernel.fingerprints import fingerprint
from services.model.client import ModelClient


def usage_of(message: anthropic.types.Message) -> Usage:
    u = message.usage
    return Usage(
        input_tokens=u.input_tokens or 0,
        output_tokens=u.output_tokens or 0,
        cache_creation_input_tokens=u.cache_creation_input_tokens or 0,
        cache_read_input_tokens=u.cache_read_input_tokens or 0,
    )


async def call_model(command: CallModel, client: ModelClient) -> ModelResponded:
    step = command.step + 1
    started = time.perf_counter()
    try:
        message = await client.create(command.messages, command.turn.persona)
    except anthropic.APIError as exc:
        metrics.model_call_duration.labels(client.model, "error").observe(time.perf_counter() - started)
        status = getattr(exc, "status_code", None)
        return ModelResponded(
            turn=command.turn,
            step=step,
            messages=command.messages,
            spent=command.spent,
            model=client.model,
            error=f"{type(exc).__name__}{f' ({status})' if status else ''}: {exc.message if hasattr(exc, 'message') else exc}",
        )
    metrics.model_call_duration.labels(client.model, "ok").observe(time.perf_counter() - started)
    content = [block.model_dump(mode="json", exclude_none=True) for block in message.content]
    calls = [
        ToolCall(id=b.id, name=b.name, input=b.input, fingerprint=fingerprint(b.name, b.input))
        for b in message.content
        if b.type == "tool_use"
    ]
    usage = usage_of(message)
    return ModelResponded(
        turn=command.turn,
        step=step,
        messages=command.messages,
        content=content,
        stop_reason=message.stop_reason,
        tool_calls=calls,
        usage=usage,
        spent=command.spent + usage,
        model=message.model,
    )
