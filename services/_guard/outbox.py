"""The guard's way out: every decision is recorded with a pending copy, published, then cleared.

A handler records its decision with the message that carries it in one conditional update, and only then publishes
it. A crash or a failed publish between the two leaves the copy in the ledger for a redelivery or the outbox pass
(`republish_all`) to publish again: a recorded decision goes out at least once, and consumers drop the duplicates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from aiokafka.errors import KafkaError
from opentelemetry.propagate import inject
from pydantic import BaseModel

from roundtrip._guard.ledger import Ledger, TurnRow
from roundtrip._kernel.wire import topology
from roundtrip._kernel.wire.events import (
    CallModel,
    CheckToolCalls,
    Outcome,
    StreamedText,
    SupportStatus,
    TurnEnded,
    TurnState,
)

log = logging.getLogger("roundtrip.guard")
T = TypeVar("T")

Publish = Callable[[str, BaseModel, str], Awaitable[None]]  # (logical topic, message, conversation id)
MODEL_OF: dict[str, type[BaseModel]] = topology.service("guard").outputs
TOPIC_OF: dict[type[BaseModel], str] = {model: topic for topic, model in MODEL_OF.items()}
SWEEP_PUBLISH_TIMEOUT_S = 1.0  # a sweeper publish taking longer means the broker is away (a healthy one acks in ms)
CLEAR_BATCH_S = 0.05


def working(message: BaseModel, words: Mapping[str, str]) -> SupportStatus | None:
    """The progress the app is told of as a decision goes out; None for a decision that starts no step."""
    if not isinstance(message, CallModel | CheckToolCalls):
        return None
    turn, activity = message.turn, ""
    if isinstance(message, CheckToolCalls):
        said = (words.get(call.name, "") for call in message.calls if call.id not in message.blocked)
        activity = "; ".join(dict.fromkeys(w for w in said if w))
    return SupportStatus(
        **turn.addressed(),
        state=TurnState.WORKING,
        step=message.step + 1,
        activity=activity,
        at=round(time.time(), 3),
        metadata=turn.metadata,
    )


def pending_copy(message: BaseModel) -> str:
    return f'{{"topic": {json.dumps(TOPIC_OF[type(message)])}, "message": {message.model_dump_json()}}}'


def traceparent() -> str | None:
    """The current span's traceparent, recorded with a decision (sweeper spans link to the turn's last hop)."""
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")


def turn_cut(message: BaseModel, streams_by_default: bool) -> StreamedText | None:
    """The cut of a streaming turn's text when it ends otherwise than by the model's answer."""
    if not isinstance(message, TurnEnded) or message.outcome is Outcome.END_TURN:
        return None
    turn = message.turn
    if not (streams_by_default if turn.stream is None else turn.stream):
        return None
    return StreamedText(
        **turn.addressed(),
        step=0,  # every step of the turn
        stream_id="",
        sequence=0,
        cut=True,
    )


class Outbox:
    """Publishes recorded decisions, clears their pending copies, republishes the ones left pending. A status or a
    stream cut beside a decision never stands in its way: one that fails to go out is only logged."""

    def __init__(
        self,
        ledger: Ledger,
        publish: Publish,
        after_s: float,
        on_ended: Callable[[str], None],
        progress: Mapping[str, str],
        streams_by_default: bool,
    ) -> None:
        self.ledger, self.publish, self.on_ended = ledger, publish, on_ended
        self.progress: Mapping[str, str] = progress
        self.streams_by_default = streams_by_default
        self.after_s = after_s
        self._clearing: asyncio.Task[None] | None = None
        self._to_clear: list[tuple[str, str]] = []

    async def emit(self, turn_id: str, pending: str, message: BaseModel, conversation_id: str) -> None:
        """Publish, then clear the pending copy off the hot path, batched (a crash before that only republishes)."""
        told = [m for m in (working(message, self.progress), turn_cut(message, self.streams_by_default)) if m]
        if not told:
            await self.publish(TOPIC_OF[type(message)], message, conversation_id)
        else:  # side by side: what the app is told costs the step no round trip of its own
            await asyncio.gather(
                self.publish(TOPIC_OF[type(message)], message, conversation_id),
                *(self._told(m, turn_id, conversation_id) for m in told),
            )
        if isinstance(message, TurnEnded):
            self.on_ended(conversation_id)
        self._to_clear.append((turn_id, pending))
        if self._clearing is None or self._clearing.done():
            self._clearing = asyncio.create_task(self._clear())

    async def _told(self, message: BaseModel, turn_id: str, conversation_id: str) -> None:
        try:
            await self.publish(TOPIC_OF[type(message)], message, conversation_id)
        except Exception as exc:  # noqa: BLE001 - a courtesy to the app: the decision must not wait on it
            log.warning("turn %s: %s not published: %s", turn_id, type(message).__name__, exc)

    async def _clear(self) -> None:
        await asyncio.sleep(CLEAR_BATCH_S)
        while self._to_clear:
            batch, self._to_clear = self._to_clear, []
            try:
                await self.ledger.published_many(batch)
            except Exception as exc:  # noqa: BLE001 - only means a republish later (the sweeper's outbox)
                log.warning("could not clear %d published decisions: %s", len(batch), exc)

    async def drain(self) -> None:
        if self._clearing is not None:
            await asyncio.gather(self._clearing, return_exceptions=True)

    async def republish(self, row: TurnRow, why: str = "a redelivery") -> None:
        pending = json.loads(row.pending or "null")
        if pending and row.pending:
            message = MODEL_OF[pending["topic"]].model_validate(pending["message"])
            log.warning("turn %s: republishing the pending %s after %s", row.turn_id, type(message).__name__, why)
            await self.emit(row.turn_id, row.pending, message, row.conversation_id)

    async def republish_all(self, older_than: float | None = None) -> int:
        """Publish every decision still pending; stop at the first publish over the sweep's bound (broker away)."""
        older_than = time.time() - self.after_s if older_than is None else older_than
        count = 0
        for row in await self.ledger.outbox(older_than):
            try:
                await asyncio.wait_for(self.republish(row, "a restart or a failed publish"), SWEEP_PUBLISH_TIMEOUT_S)
                count += 1
            except (TimeoutError, KafkaError) as exc:
                log.warning(
                    "outbox: the pending decision of turn %s not published (%s); the broker looks away, "
                    "the rest waits for the next pass",
                    row.turn_id,
                    type(exc).__name__,
                )
                break
            except Exception:  # the rest of the outbox still goes out; this row stays pending
                log.exception("turn %s: republishing its pending decision failed; will retry", row.turn_id)
        return count


class Bounded:
    """The sweeper's publishes, each bounded: after one fails, `reachable` turns false and the sweep only records."""

    def __init__(self) -> None:
        self.reachable = True

    async def __call__(self, work: Callable[[], Awaitable[T]], what: str) -> T | None:
        try:
            return await asyncio.wait_for(work(), SWEEP_PUBLISH_TIMEOUT_S)
        except (TimeoutError, KafkaError) as exc:
            self.reachable = False
            log.warning(
                "sweep: %s not published (%s); recording the rest, the outbox publishes them later",
                what,
                type(exc).__name__,
            )
            return None
