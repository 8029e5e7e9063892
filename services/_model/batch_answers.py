"""An ended batch's results: a succeeded one becomes its call's ModelResponded (with the batch id); a failed one is
tried once more, then is the call's error. The turn always comes from the recorded CallModel, never from a result.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from roundtrip._kernel.observability.telemetry import mark_error, span_in_turn
from roundtrip._kernel.wire.events import CallModel, ModelResponded
from roundtrip._model.batch_api import Result
from roundtrip._model.calls import Limits, responded

log = logging.getLogger("roundtrip.model")
RETRY_SUFFIX = "_r"


class AnsweredCalls(Protocol):
    async def in_batch(self, batch_id: str) -> dict[str, Any]: ...

    async def done(self, turn_id: str, step: int, now: float) -> None: ...

    async def retry(self, turn_id: str, step: int, custom_id: str) -> None: ...


def failed(command: CallModel, model: str, error: str, batch_id: str) -> ModelResponded:
    """The call's error: the loop ends the turn with its documented reply (model_error)."""
    return ModelResponded(
        turn=command.turn,
        step=command.step + 1,
        messages=command.messages,
        spent=command.spent,
        model=model,
        error=error,
        batch_id=batch_id,
    )


@dataclass(frozen=True)
class Answers:
    """`direct`: the model core's call of a retry that cannot wait for a batch (None: the fence refused it)."""

    calls: Callable[[], AnsweredCalls]
    model: str
    limits: Limits
    direct: Callable[[CallModel], Awaitable[ModelResponded | None]]
    publish: Callable[[ModelResponded, str], Awaitable[None]]
    clock: Callable[[], float]
    retry_direct_within_s: float

    async def collect(self, batch_id: str, results: AsyncIterator[Result]) -> int:
        """Answer every open call of an ended batch from its results; how many results were answers."""
        waiting = await self.calls().in_batch(batch_id)
        answered = 0
        async for result in results:
            row = waiting.pop(result.custom_id, None)
            if row is None:
                log.warning(
                    "batch %s: a result for %r, not an open call of that batch: ignored", batch_id, result.custom_id
                )
                continue
            await self.answer(row, result, batch_id)
            answered += 1
        for row in waiting.values():
            await self.answer(row, Result(row.custom_id, "expired", None, "no result came for it"), batch_id)
        return answered

    async def answer(self, row: Any, result: Result, batch_id: str) -> None:
        command = CallModel.model_validate_json(row.command_json)
        if result.kind == "succeeded":
            event = responded(command, result.message, command.step + 1, self.limits)
            await self.published(row, command, event.model_copy(update={"batch_id": batch_id}))
        elif not row.retried:
            await self.retry(row, command, result)
        else:
            why = f"its Message Batch result was {result.kind} twice ({result.error or 'no error given'})"
            await self.published(row, command, failed(command, self.model, why, batch_id))

    async def retry(self, row: Any, command: CallModel, result: Result) -> None:
        deadline_at = command.turn.deadline_at
        direct = bool(deadline_at) and deadline_at - self.clock() < self.retry_direct_within_s
        log.warning(
            "turn %s step %d: its batch result was %s (%s): tried once more %s",
            command.turn.turn_id,
            command.step,
            result.kind,
            result.error or "no error given",
            "as a direct call" if direct else "in the next batch",
        )
        if not direct:
            await self.calls().retry(row.turn_id, row.step, f"{row.custom_id}{RETRY_SUFFIX}")
            return
        event = await self.direct(command)
        if event is None:  # the turn ended meanwhile: nothing to answer
            await self.calls().done(row.turn_id, row.step, self.clock())
            return
        await self.published(row, command, event)

    async def published(self, row: Any, command: CallModel, event: ModelResponded) -> None:
        """Publish, then mark done: a crash between them publishes again (the guard drops a step it has)."""
        with span_in_turn("model.batch_result", command.turn, row.traceparent, event.step) as span:
            if event.batch_id:
                span.set_attribute("roundtrip.batch_id", event.batch_id)
            if event.error:
                mark_error(span, f"model call failed: {event.error}", "model_error")
                log.warning("turn %s step %d: model call failed: %s", command.turn.turn_id, event.step, event.error)
            await self.publish(event, command.turn.conversation_id)
        await self.calls().done(row.turn_id, row.step, self.clock())
