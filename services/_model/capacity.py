"""The model service's share of the Messages API's rate limits: one limiter per process, adapted from the API's answers.

Every call waits for its start (`acquire`), then reports `answered` (with the `anthropic-ratelimit-*` headers and
usage) or `refused` (a 429's or 529's retry-after). With headers, starts are paced 1/rate apart under the ceiling the
headers give, by AIMD; before the first answer and after a 429 a slow-start window caps the calls in flight. Without
headers (Bedrock, Vertex AI, Foundry) the window alone is the control, as TCP's congestion window. Replicas converge on
equal shares of the one limit with no coordinator (docs/operating/scaling.md, docs/decisions/model-capacity.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

from roundtrip._kernel.clock import Clock

LOW = 0.5  # a dimension whose remaining is below this share of its peak is being drained: slow down
BETA = 0.7
RAMP_S = 20.0  # additive increase: the ceiling over this many seconds (ceiling / RAMP_S calls per second, per second)
EPOCH_S = 2.0
MIN_RATE = 0.05
BACKLOG_S = 2.0  # more calls waiting than this many seconds of the rate: at the limit (the consumer pauses)
TOKEN_EWMA = 0.05
INITIAL_WINDOW = 4  # calls in flight while nothing is known (a cold process), and again after a 429
OPEN_AFTER = 2.0  # the window opens when it holds this many times the calls the rate keeps in flight
LATENCY_EWMA = 0.1
INCREASE = 0.5  # without headers: calls per round trip after slow start (why not TCP's 1: decisions/model-capacity.md)
WINDOW_BETA = BETA
MIN_WINDOW = 1.0
BARE_PAUSE_S = 1.0  # without headers: a refused call's first pause while no answer has measured a round trip
MAX_BARE_PAUSE_S = 8.0
DIMENSIONS = ("requests", "input-tokens", "output-tokens")
HEADER = "anthropic-ratelimit-{}-{}"


@dataclass(frozen=True)
class Signals:
    """What a platform's answers tell the limiter."""

    headers: bool  # its answers carry `anthropic-ratelimit-*`: the rate is learnt from them; else from the 429s alone
    bare_429_throttles: bool  # a 429 without retry-after is a throttle to wait out; else a spend limit (the error)


HEADERS = Signals(headers=True, bare_429_throttles=False)
REFUSALS = Signals(headers=False, bare_429_throttles=True)


class Busy(Exception):
    """No capacity before the caller's deadline."""


@dataclass
class Reading:
    limit: dict[str, float] = field(default_factory=dict)
    remaining: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, headers: Mapping[str, str] | None) -> Reading:
        reading = cls()
        for dimension in DIMENSIONS:
            for kind, into in (("limit", reading.limit), ("remaining", reading.remaining)):
                if (value := _number((headers or {}).get(HEADER.format(dimension, kind)))) is not None:
                    into[dimension] = value
        return reading


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


class Capacity:
    def __init__(
        self,
        clock: Clock,
        rng: random.Random,
        slow_start: bool,
        on_throttle: Callable[[bool], None] | None = None,
        signals: Signals = HEADERS,
    ) -> None:
        """`rng` jitters the pauses; `slow_start` off: no window of calls in flight (a plain loop's stand-in), unless
        without headers."""
        self.signals = signals
        slow_start = slow_start or not signals.headers
        self._clock = clock
        self._slow_start = slow_start
        self._rng = rng
        self.rate: float | None = None  # calls per second this process starts; None: not paced (no limit known)
        self._next_at = 0.0
        self.hold_until = 0.0
        self._cut_at = -EPOCH_S
        self._epoch_at = 0.0
        self._answers = self._drained_answers = 0
        self._limited = False
        self._limit: dict[str, float] = {}
        self._peak: dict[str, float] = {}
        self._top_rate = 0.0  # the highest rate in use when a cut came (the ramp's top while no ceiling is known)
        self._per_call = {"input-tokens": 0.0, "output-tokens": 0.0}
        self._started: deque[float] = deque()  # starts of the last EPOCH_S: the rate in use before any is known
        self.window: float | None = INITIAL_WINDOW if slow_start else None
        self.in_flight = 0
        self._window_waiters: deque[asyncio.Future[None]] = deque()
        self._latency = 0.0
        self.threshold = math.inf
        self.waiting = 0
        self.throttled = False
        self._on_throttle = on_throttle
        self.refusals = 0

    async def acquire(self, deadline: float) -> float:
        """Wait for a place in the window (FIFO), then a slot; the seconds waited, or Busy past `deadline`.

        Every acquire that returns must be followed by one `ended`."""
        begun = now = self._clock.monotonic()
        self.waiting += 1
        self._check_throttle()
        try:
            await self._enter_window(deadline)
            try:
                now = await self._slot(deadline)
            except BaseException:
                self.ended()
                raise
        finally:
            self.waiting -= 1
            self._check_throttle()
        self._started.append(now)
        self._forget_starts(now)
        return now - begun

    async def _enter_window(self, deadline: float) -> None:
        if self.window is None or (self.in_flight < self.window and not self._window_waiters):
            self.in_flight += 1
            return
        entered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._window_waiters.append(entered)
        try:
            async with asyncio.timeout(max(0.0, deadline - self._clock.monotonic())):
                await entered
        except BaseException as exc:
            if entered.done() and not entered.cancelled():
                self.ended()
            else:
                entered.cancel()
                with contextlib.suppress(ValueError):
                    self._window_waiters.remove(entered)
            if isinstance(exc, TimeoutError):
                raise Busy("no room among the calls in flight before the turn's deadline") from None
            raise

    async def _slot(self, deadline: float) -> float:
        now = self._clock.monotonic()
        while True:
            slot = max(now, self._next_at, self.hold_until)
            if slot > now and slot > deadline:  # no wait, no refusal: a call due now is never busy
                raise Busy(f"no capacity for {slot - now:.1f} s, past the turn's deadline")
            if self.rate is not None:
                self._next_at = slot + 1.0 / self.rate
            if slot > now:
                await asyncio.sleep(slot - now)
            now = self._clock.monotonic()
            if self.hold_until <= now:  # a 429 during the sleep moved every slot past its hold: take a new one
                return now

    def ended(self) -> None:
        """A call that `acquire` let start has ended, however: its place goes to the next call waiting."""
        self.in_flight = max(0, self.in_flight - 1)
        self._admit()

    def _admit(self) -> None:
        while self._window_waiters and (self.window is None or self.in_flight < self.window):
            entered = self._window_waiters.popleft()
            if not entered.done():
                self.in_flight += 1
                entered.set_result(None)

    def answered(
        self, headers: Mapping[str, str] | None, input_tokens: int, output_tokens: int, started_at: float, waited: bool
    ) -> None:
        if not self.signals.headers:
            self._widen(self._clock.monotonic() - started_at)
            return
        reading = Reading.of(headers)
        before = self.ceiling()
        self._learn(reading, input_tokens, output_tokens)
        ceiling = self.ceiling()
        if ceiling is not None and (self.rate is None or (before is not None and self.rate >= before)):
            # the first ceiling known, or a rate at the ceiling follows it (it moves with the calls' sizes)
            self.rate = ceiling
        self._answers += 1
        drained = self._drained(reading)
        self._drained_answers += drained
        self._limited = self._limited or waited
        now = self._clock.monotonic()
        self._grow_window(now - started_at, drained, ceiling)
        if now - self._epoch_at >= EPOCH_S and self.rate is not None:
            self._adapt(ceiling, now)
        if ceiling is not None and self.rate is not None:
            self.rate = min(self.rate, ceiling)

    def _grow_window(self, latency: float, drained: bool, ceiling: float | None) -> None:
        self._latency = latency if self._latency == 0 else self._latency + LATENCY_EWMA * (latency - self._latency)
        if self.window is None:
            return
        if ceiling is None and self.rate is None:  # no limit announced, none learnt from a 429: nothing to protect
            self.window = None
        elif not drained:
            self.window += 1
            if self.window >= max(INITIAL_WINDOW, OPEN_AFTER * (self.rate or 0.0) * self._latency):
                self.window = None
        self._admit()

    def _widen(self, latency: float) -> None:
        self._latency = latency if self._latency == 0 else self._latency + LATENCY_EWMA * (latency - self._latency)
        assert self.window is not None
        if self._window_waiters or self.in_flight >= self.window:  # the answered call is still counted in flight
            self.window += 1.0 if self.window < self.threshold else INCREASE / self.window
        self._admit()

    def _adapt(self, ceiling: float | None, now: float) -> None:
        """Cut in proportion to the share of drained answers (the same share in every replica), then add one step."""
        assert self.rate is not None
        drained = self._drained_answers / self._answers if self._answers else 0.0
        rate = self.rate * (1.0 - drained * (1.0 - BETA))
        if self._limited and drained < 1.0:
            rate += (ceiling or max(self._top_rate, rate)) * EPOCH_S / RAMP_S
        self.rate = max(MIN_RATE, rate)
        self._epoch_at, self._answers, self._drained_answers, self._limited = now, 0, 0, False

    def refused(self, retry_after: float | None, started_at: float, in_a_row: int, overloaded: bool = False) -> float:
        """A 429 or 529: cut, and hold the process; the seconds this call alone pauses (0: the hold is its pause).

        Only a headerless refusal without retry-after pauses the call alone, doubling with `in_a_row`. An `overloaded`
        one (a 529: the API is overloaded for everyone, the fleet's rate within its limit) holds without a cut: cut
        once an epoch through a minute's burst, the rate would reach its floor and take minutes to climb back."""
        self.refusals += 1
        if not overloaded and not self.signals.headers:
            self._narrow(started_at)
            if retry_after is None:
                base = self._latency or BARE_PAUSE_S
                return cast(float, min(MAX_BARE_PAUSE_S, base * 2 ** (in_a_row - 1)) * self._rng.uniform(0.5, 1.0))
        elif not overloaded:
            self._cut(started_at)
            if self._slow_start:
                self.window = min(self.window or INITIAL_WINDOW, INITIAL_WINDOW)
        retry_after = retry_after or 0.0
        now = self._clock.monotonic()
        spacing = 1.0 / self.rate if self.rate else 0.0
        until = now + retry_after + self._rng.uniform(0.0, 0.25 * retry_after + spacing)
        if until > self.hold_until:
            self.hold_until = until
            self._next_at = max(self._next_at, until)
            with contextlib.suppress(RuntimeError):  # no event loop (a simulation): nothing to wake at the hold's end
                asyncio.get_running_loop().call_later(until - now + 0.001, self._check_throttle)
        self._check_throttle()
        return 0.0

    def _narrow(self, started_at: float) -> None:
        if started_at < self._cut_at:  # started by the window before the last cut: says nothing of this one
            return
        assert self.window is not None
        self.window = self.threshold = max(MIN_WINDOW, self.window * WINDOW_BETA)
        self._cut_at = self._clock.monotonic()

    def delay(self) -> float:
        return max(0.0, self._next_at - self._clock.monotonic(), self.hold_until - self._clock.monotonic())

    def ceiling(self) -> float | None:
        rates = []
        for dimension, per_minute in self._limit.items():
            per_call = 1.0 if dimension == "requests" else self._per_call.get(dimension, 0.0)
            if per_call > 0:
                rates.append(per_minute / 60.0 / per_call)
        return max(MIN_RATE, min(rates)) if rates else None

    def _learn(self, reading: Reading, input_tokens: int, output_tokens: int) -> None:
        if self._limit and not reading.limit:  # the limits that were announced are gone (a simulator's, lifted)
            self.rate, self._peak, self.window = None, {}, None
            self._admit()
        self._limit = dict(reading.limit)
        for dimension, left in reading.remaining.items():
            self._peak[dimension] = max(self._peak.get(dimension, 0.0), left)
        for dimension, counted in (("input-tokens", input_tokens), ("output-tokens", output_tokens)):
            average = self._per_call[dimension]
            self._per_call[dimension] = counted if average == 0 else average + TOKEN_EWMA * (counted - average)

    def _drained(self, reading: Reading) -> bool:
        return any(left < LOW * self._peak[d] for d, left in reading.remaining.items() if self._peak.get(d))

    def _cut(self, started_at: float) -> None:
        now = self._clock.monotonic()
        if started_at < self._cut_at or now - self._cut_at < EPOCH_S:
            return
        self._forget_starts(now)
        in_use = self.rate if self.rate is not None else max(MIN_RATE, len(self._started) / EPOCH_S)
        self._top_rate = max(self._top_rate, in_use)
        self.rate = max(MIN_RATE, in_use * BETA)
        self._cut_at = now

    def _forget_starts(self, now: float) -> None:
        while self._started and self._started[0] < now - EPOCH_S:
            self._started.popleft()

    def _check_throttle(self) -> None:
        """Throttled while a hold lasts or the backlog passes BACKLOG_S of the rate; released at half of it."""
        now = self._clock.monotonic()
        rate = self.rate
        if not self.signals.headers and self.window is not None and self._latency > 0:
            rate = self.window / self._latency
        backlog = max(2.0, (rate or 0.0) * BACKLOG_S)
        if self.hold_until > now or (rate is not None and self.waiting > backlog):
            throttled = True
        else:
            throttled = self.throttled and rate is not None and self.waiting > backlog / 2
        if throttled != self.throttled:
            self.throttled = throttled
            if self._on_throttle is not None:
                self._on_throttle(throttled)
