"""The model service's share of the Messages API's rate limits: one limiter per process, adapted from the API's answers.

Every call waits here for its start (`acquire`), then says how the API answered: `answered` with the
response's `anthropic-ratelimit-*` headers and usage, or `refused` with a 429's (or 529's) retry-after.
The limiter keeps one number, the rate (calls per second) this process may start, and spaces the starts
1/rate apart: each waiter sleeps until its own slot, so there is no burst and no polling.

* **Ceiling.** The `-limit` headers say what the organisation may do per minute: requests-limit/60 calls
  per second, and input-tokens-limit/60 (output likewise) divided by what an average call counts. Input
  tokens count like the API counts them: uncached input plus cache writes; cache reads do not count.
  The rate never passes the ceiling; the first ceiling known is the first rate.
* **Multiplicative decrease.** A 429 or a 529, or an answer whose `-remaining` has fallen below LOW of the
  most it has been seen to hold (the bucket is being drained: the fleet, or another app, starts more than
  it refills), cuts the rate to BETA of itself, at most once per EPOCH_S, and never for a call started before the
  last cut (its answer says nothing of the new rate). A 429 also **holds** the whole process until its
  retry-after has passed, plus jitter of this process's own, then the waiting calls resume one slot apart.
* **Additive increase.** An answer with room left raises the rate so that it would climb from zero to the
  ceiling in RAMP_S seconds of calls, and only while calls wait here (a rate nobody uses is not tested).

* **Slow start.** Until the first answer, and again from a 429 on, the process has too little to go by: the
  headers it knows may be stale, the bucket may hold less than the minute's limit (the API may enforce a limit
  over shorter intervals, or other applications of the organisation drain it). So a window caps the calls in
  flight (started, not answered): INITIAL_WINDOW of them, one more per answer with room left (doubling per round
  trip, as TCP's slow start grows its window by the acknowledgements), and none past the calls the rate keeps in
  flight (OPEN_AFTER of its rate x the calls' latency), where the window opens and pacing alone rules. An answer
  that announces no limit opens it at once (nothing to protect); a drained answer stops its growth.

Replicas are not told about each other: each sees the same organisation-wide headers and 429s and cuts
when they say so, and AIMD's cuts in proportion to each one's rate make them converge on equal shares of
the one limit (Chiu and Jain, 1989), with no coordinator. With no header and no refusal, nothing is paced.

**Without headers** (Amazon Bedrock, Google Vertex AI, Microsoft Foundry: `Signals` of the platform's adapter,
services/_model/providers.py), there is no limit to read, only the 429s themselves, so the window of calls in flight is
the whole control, as TCP's congestion window is: no pacing, and the rate is what the window keeps in flight per round
trip. Slow start as above (INITIAL_WINDOW, one more per answer) until the first 429; from then on **additive increase**
of INCREASE calls per round trip (INCREASE/window per answer, and only while the window is full: a window nobody fills
is not tested) and **multiplicative decrease** to WINDOW_BETA of the window on a 429, once per round trip (a 429 of a
call started before the last cut says nothing of the window since), never below MIN_WINDOW. A 429 with `retry-after`
holds the process as above; one without (Bedrock's ThrottlingException, Vertex's RESOURCE_EXHAUSTED) holds only its own
call, for about a round trip with jitter, doubling with each of its refusals in a row (`refused`'s answer), and the call
keeps its place in the window meanwhile (services/_model/attempts.py): the cut window slows the process, and neither the
call nor a successor of its place hammers a bucket that stays empty. Replicas converge on equal windows of the one
limit by the same rule, each probing on its own: N replicas' windows grow N times as fast, so they meet more 429s than
one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

LOW = 0.5  # a dimension whose remaining is below this share of its peak is being drained: slow down
BETA = 0.7  # multiplicative decrease
RAMP_S = 20.0  # additive increase: the ceiling over this many seconds (ceiling / RAMP_S calls per second, per second)
EPOCH_S = 2.0  # at most one cut per this long
MIN_RATE = 0.05  # calls per second: never slower than this (a hold still stops everything)
# more calls waiting than this many seconds of the rate: the process is at its limit (its consumer pauses)
BACKLOG_S = 2.0
TOKEN_EWMA = 0.05  # weight of the newest call in the average tokens per call (calls of one turn differ a lot)
INITIAL_WINDOW = 4  # calls in flight while nothing is known (a cold process), and again after a 429
OPEN_AFTER = 2.0  # the window opens when it holds this many times the calls the rate keeps in flight
LATENCY_EWMA = 0.1  # weight of the newest answer in the average latency of a call
# without headers: calls the window grows by per round trip once slow start has ended. TCP's is 1; a window of ~10
# calls is tiny next to TCP's, and each 429 cycle (from WINDOW_BETA of the window back to where the 429 came) lasts
# (1 - WINDOW_BETA) x window / INCREASE round trips: 0.5 halves the share of calls refused (test_capacity_aimd.py)
INCREASE = 0.5
WINDOW_BETA = BETA  # without headers: a 429 cuts the window to this share of itself
MIN_WINDOW = 1.0  # without headers: the fewest calls in flight a 429 can cut the window to
BARE_PAUSE_S = 1.0  # without headers: a refused call's first pause while no answer has measured a round trip
MAX_BARE_PAUSE_S = 8.0  # ... and the longest, after refusals in a row
DIMENSIONS = ("requests", "input-tokens", "output-tokens")
HEADER = "anthropic-ratelimit-{}-{}"


@dataclass(frozen=True)
class Signals:
    """What a platform's answers tell the limiter (each adapter of services/_model/providers.py says which)."""

    headers: bool  # its answers carry `anthropic-ratelimit-*`: the rate is learnt from them; else from the 429s alone
    bare_429_throttles: bool  # a 429 without retry-after is a throttle to wait out; else a spend limit (the error)


HEADERS = Signals(headers=True, bare_429_throttles=False)  # the Anthropic API
REFUSALS = Signals(headers=False, bare_429_throttles=True)  # Bedrock, Vertex AI, Foundry


class Busy(Exception):
    """No capacity before the caller's deadline."""


@dataclass
class Reading:
    """What one answer's `anthropic-ratelimit-*` headers said: per dimension, its per-minute limit and what remains."""

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
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        on_throttle: Callable[[bool], None] | None = None,
        slow_start: bool = True,
        signals: Signals = HEADERS,
    ) -> None:
        """`slow_start` off: no window of calls in flight, ever (a plain loop's stand-in for no limiter), where headers
        are read; without them the window is the limiter and is always kept."""
        self.signals = signals
        slow_start = slow_start or not signals.headers
        self._clock = clock
        self._slow_start = slow_start
        self._rng = rng or random.Random()
        self.rate: float | None = None  # calls per second this process starts; None: not paced (no limit known)
        self._next_at = 0.0  # the next free slot
        self.hold_until = 0.0  # a 429 said stop until then
        self._cut_at = -EPOCH_S  # when a 429 last cut the rate
        self._epoch_at = 0.0  # answers since then decide the next adaptation
        self._answers = self._drained_answers = 0
        self._limited = False  # a call of this epoch waited for its slot: the rate is in use
        self._limit: dict[str, float] = {}
        self._peak: dict[str, float] = {}  # the most each dimension has been seen to hold
        self._top_rate = 0.0  # the highest rate in use when a cut came (the ramp's top while no ceiling is known)
        self._per_call = {"input-tokens": 0.0, "output-tokens": 0.0}  # average tokens counted per call
        self._started: deque[float] = deque()  # starts of the last EPOCH_S: the rate in use before any is known
        self.window: float | None = (
            INITIAL_WINDOW if slow_start else None
        )  # calls in flight allowed (None: open, the rate alone rules)
        self.in_flight = 0  # started and not ended (`ended`)
        self._window_waiters: deque[asyncio.Future[None]] = deque()
        self._latency = 0.0  # average seconds from a call's start to its answer
        self.threshold = (
            math.inf
        )  # without headers: the window where slow start ends (WINDOW_BETA of it at the last 429)
        self.waiting = 0
        self.throttled = False
        self._on_throttle = on_throttle
        self.refusals = 0

    # -- the calls' side --------------------------------------------------------------------
    async def acquire(self, deadline: float) -> float:
        """Wait for this call's place in the window (FIFO), then its slot (1/rate apart, after any hold); the seconds
        waited. Raises Busy when it would have to wait past `deadline` (monotonic): at once for a slot, when the
        deadline comes for the window. Every acquire that returns is followed by one `ended`."""
        begun = now = self._clock()
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
            async with asyncio.timeout(max(0.0, deadline - self._clock())):
                await entered  # `_admit` counted this call in flight when it set the result
        except BaseException as exc:
            if entered.done() and not entered.cancelled():  # admitted as it gave up: give its place back
                self.ended()
            else:
                entered.cancel()
                with contextlib.suppress(ValueError):
                    self._window_waiters.remove(entered)
            if isinstance(exc, TimeoutError):
                raise Busy("no room among the calls in flight before the turn's deadline") from None
            raise

    async def _slot(self, deadline: float) -> float:
        now = self._clock()
        while True:
            slot = max(now, self._next_at, self.hold_until)
            if slot > now and slot > deadline:  # no wait, no refusal: a call due now is never busy
                raise Busy(f"no capacity for {slot - now:.1f} s, past the turn's deadline")
            if self.rate is not None:
                self._next_at = slot + 1.0 / self.rate
            if slot > now:
                await asyncio.sleep(slot - now)
            now = self._clock()
            if self.hold_until <= now:  # a 429 during the sleep moved every slot past its hold: take a new one
                return now

    def ended(self) -> None:
        """A call that `acquire` let start has ended (answered, refused, failed or cancelled): its place in the window
        goes to the next call waiting."""
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
        """A call started at `started_at` was answered: learn the limits; once per epoch, adapt the rate."""
        if not self.signals.headers:
            self._widen(self._clock() - started_at)
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
        now = self._clock()
        self._grow_window(now - started_at, drained, ceiling)
        if now - self._epoch_at >= EPOCH_S and self.rate is not None:
            self._adapt(ceiling, now)
        if ceiling is not None and self.rate is not None:
            self.rate = min(self.rate, ceiling)

    def _grow_window(self, latency: float, drained: bool, ceiling: float | None) -> None:
        """Slow start: one more call in flight per answer with room left, until the window holds OPEN_AFTER times what
        the rate keeps in flight; an answer announcing no limit opens it at once."""
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
        """Without headers, an answer: one more call in flight during slow start, INCREASE/window more after it
        (INCREASE per round trip), while the window is full."""
        self._latency = latency if self._latency == 0 else self._latency + LATENCY_EWMA * (latency - self._latency)
        assert self.window is not None  # without headers the window is never open
        if self._window_waiters or self.in_flight >= self.window:  # the answered call is still counted in flight
            self.window += 1.0 if self.window < self.threshold else INCREASE / self.window
        self._admit()

    def _adapt(self, ceiling: float | None, now: float) -> None:
        """The end of an epoch: cut in proportion to the share of answers that found the bucket drained (every replica
        sees the same share, so each cuts the same fraction of its own rate), then, if calls waited, add the same
        step to every replica's rate (DCTCP's rule for ECN marks: AIMD without waiting for a drop)."""
        assert self.rate is not None  # only a paced process adapts its rate
        drained = self._drained_answers / self._answers if self._answers else 0.0
        rate = self.rate * (1.0 - drained * (1.0 - BETA))
        if self._limited and drained < 1.0:
            rate += (ceiling or max(self._top_rate, rate)) * EPOCH_S / RAMP_S
        self.rate = max(MIN_RATE, rate)
        self._epoch_at, self._answers, self._drained_answers, self._limited = now, 0, 0, False

    def refused(self, retry_after: float | None, started_at: float, in_a_row: int = 1) -> float:
        """A 429 or 529 for a call started at `started_at`, its `retry_after` (None: it said nothing), the call's
        `in_a_row`-th refusal without an answer between. With a retry-after, cut and hold the process `retry_after` +
        jitter; without headers and without retry-after, cut the window and hold only this call: the seconds it pauses
        before it tries again (0: the process's hold is its pause)."""
        self.refusals += 1
        if not self.signals.headers:
            self._narrow(started_at)
            if retry_after is None:
                base = self._latency or BARE_PAUSE_S
                return cast(float, min(MAX_BARE_PAUSE_S, base * 2 ** (in_a_row - 1)) * self._rng.uniform(0.5, 1.0))
        else:
            self._cut(started_at)
            if self._slow_start:  # slow start again from the hold's end
                self.window = min(self.window or INITIAL_WINDOW, INITIAL_WINDOW)
        retry_after = retry_after or 0.0
        now = self._clock()
        spacing = 1.0 / self.rate if self.rate else 0.0
        until = now + retry_after + self._rng.uniform(0.0, 0.25 * retry_after + spacing)
        if until > self.hold_until:
            self.hold_until = until
            self._next_at = max(self._next_at, until)
            with contextlib.suppress(RuntimeError):  # no event loop runs (a simulation): nothing to wake
                # the hold ends on its own: look again then, whether calls wait or not
                asyncio.get_running_loop().call_later(until - now + 0.001, self._check_throttle)
        self._check_throttle()
        return 0.0

    def _narrow(self, started_at: float) -> None:
        """Without headers, a 429: the window to BETA of itself, once per round trip (a call started before the last
        cut was started by the window before it), never below MIN_WINDOW; slow start ends there."""
        if started_at < self._cut_at:
            return
        assert self.window is not None
        self.window = self.threshold = max(MIN_WINDOW, self.window * WINDOW_BETA)
        self._cut_at = self._clock()

    # -- what it knows --------------------------------------------------------------------
    def delay(self) -> float:
        """Seconds a call asking now would wait for its slot."""
        return max(0.0, self._next_at - self._clock(), self.hold_until - self._clock())

    def ceiling(self) -> float | None:
        """Calls per second the organisation's limits allow (None: no limit known)."""
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
        now = self._clock()
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
        """Throttled while a hold lasts or more calls wait than BACKLOG_S of the rate; released at half that backlog."""
        now = self._clock()
        rate = self.rate
        if not self.signals.headers and self.window is not None and self._latency > 0:
            rate = self.window / self._latency  # what the window keeps in flight per round trip
        backlog = max(2.0, (rate or 0.0) * BACKLOG_S)
        if self.hold_until > now or (rate is not None and self.waiting > backlog):
            throttled = True
        else:
            throttled = self.throttled and rate is not None and self.waiting > backlog / 2
        if throttled != self.throttled:
            self.throttled = throttled
            if self._on_throttle is not None:
                self._on_throttle(throttled)
