"""The order of `roundtrip ask`'s live view: a turn's records shown in the order they happened.

A fetch from several topics hands back each partition's records together and in no order between topics, so a step's
gate verdict could come before that step's model line, even a poll later. So each record waits here until what it
follows has been shown (`_after` says what that is); one whose predecessor never comes is shown after HOLD_S anyway,
and the reply shows everything still held first.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from roundtrip._kernel.clock import Clock
from roundtrip._kernel.wire import topics

HOLD_S = 2.0  # the longest a record waits for the one it follows
LAST = 1_000_000  # the sort step of what has no step (after everything held of known steps)

# the place of each record within its step, for showing what is held in order
PHASE = {
    topics.ITERATIONS: 0,
    topics.TOOL_CALLS: 1,
    topics.TOOL_BATCHES: 2,
    topics.APPROVAL_REQUESTS: 3,
    topics.SUPPORT_STATUS: 4,
    topics.APPROVAL_DECISIONS: 5,
    topics.MODEL_CALLS: 6,
    topics.TURN_EVENTS: 7,
    topics.SUPPORT_REPLIES: 8,
}


def _working(topic: str, data: dict[str, Any]) -> bool:
    """A step's progress (support.status, state working), not a wait for a person."""
    return topic == topics.SUPPORT_STATUS and data.get("state") == "working"


@dataclass(order=True)
class Held:
    sort: tuple[int, int, int]
    topic: str = field(compare=False)
    data: dict[str, Any] = field(compare=False)
    arrived: float = field(compare=False)


class StepOrder:
    """Records of one request's turn in, the same records out in the order they happened (`add`, then `ready`)."""

    def __init__(self, request_id: str, clock: Clock) -> None:
        self.request_id, self.clock = request_id, clock
        self.held: list[Held] = []
        self.shown: set[tuple[str, Any]] = set()
        self.with_calls: set[int] = set()  # steps whose model response made tool calls
        self.approval_step: dict[str, int] = {}
        self._seq = itertools.count()

    def add(self, topic: str, data: dict[str, Any]) -> None:
        """Hold a record of this request's turn (another request's is dropped; decisions, naming no request, kept)."""
        if topic in (topics.SUPPORT_REPLIES, topics.SUPPORT_STATUS):
            mine = data.get("request_id") == self.request_id
        else:
            mine = topic == topics.APPROVAL_DECISIONS or (data.get("turn") or {}).get("request_id") == self.request_id
        if mine:
            if topic == topics.APPROVAL_REQUESTS:
                self.approval_step[data.get("approval_id", "")] = data.get("step", LAST)
            phase = (
                -1 if _working(topic, data) else PHASE.get(topic, 7)
            )  # a step's progress comes before its model line
            arrived = self.clock.monotonic()
            self.held.append(Held((self._step(topic, data), phase, next(self._seq)), topic, data, arrived))

    def ready(self) -> list[tuple[str, dict[str, Any]]]:
        """The records that may be shown now, in order: each whose predecessors were shown, or that waited HOLD_S;
        everything held once the reply is among them."""
        out: list[tuple[str, dict[str, Any]]] = []
        final = any(h.topic == topics.SUPPORT_REPLIES for h in self.held)
        now = self.clock.monotonic()
        while True:
            due = next(
                (
                    h
                    for h in sorted(self.held)
                    if final or now - h.arrived >= HOLD_S or all(key in self.shown for key in self._after(h))
                ),
                None,
            )
            if due is None:
                return out
            self.held.remove(due)
            self._shown(due)
            out.append((due.topic, due.data))

    def _step(self, topic: str, data: dict[str, Any]) -> int:
        if _working(topic, data):
            step = data.get("step")
            return step if isinstance(step, int) else LAST
        if topic in (topics.SUPPORT_STATUS, topics.APPROVAL_DECISIONS):
            return self.approval_step.get(data.get("approval_id", ""), LAST)
        step = data.get("step")
        return step if isinstance(step, int) and topic != topics.SUPPORT_REPLIES else LAST

    def _after(self, held: Held) -> tuple[tuple[str, Any], ...]:
        """The keys shown before this record may be: what it follows."""
        topic, data, step = held.topic, held.data, held.sort[0]
        if _working(topic, data):  # follows nothing: it is told as the step starts
            return ()
        if topic == topics.ITERATIONS:
            return ((topics.MODEL_CALLS, step - 1),)
        if topic in (topics.TOOL_CALLS, topics.TOOL_BATCHES):
            return ((topics.ITERATIONS, step),)
        if topic == topics.APPROVAL_REQUESTS:
            return ((topics.TOOL_BATCHES, step),)
        if topic in (topics.SUPPORT_STATUS, topics.APPROVAL_DECISIONS):
            return (("approval", data.get("approval_id")),)
        if topic == topics.MODEL_CALLS and step > 0:
            return ((topics.ITERATIONS, step),) + (((topics.TOOL_BATCHES, step),) if step in self.with_calls else ())
        return ()

    def _shown(self, held: Held) -> None:
        self.shown.add((held.topic, held.sort[0]))
        if held.topic == topics.ITERATIONS and held.data.get("tool_calls"):
            self.with_calls.add(held.sort[0])
        if held.topic == topics.APPROVAL_REQUESTS:
            self.shown.add(("approval", held.data.get("approval_id")))
