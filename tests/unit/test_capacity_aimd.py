"""The limiter where no rate-limit header is sent (Bedrock, Vertex AI, Foundry): the AIMD window of calls in flight
learnt from the 429s alone (services/_model/capacity.py), and how services/_model/attempts.py takes a 429 without
retry-after on such a platform and on the Anthropic API. Fakes only: a simulated clock and bucket."""

from __future__ import annotations

import asyncio
import heapq
import random
import time

import pytest

from roundtrip._kernel.settings import Settings
from roundtrip._model import providers
from roundtrip._model.attempts import MARGIN_S, attempt
from roundtrip._model.capacity import (
    BETA,
    HEADERS,
    INCREASE,
    INITIAL_WINDOW,
    MAX_BARE_PAUSE_S,
    MIN_WINDOW,
    REFUSALS,
    Capacity,
)
from tests.clocks import showing
from tests.cores import new_capacity, refused_once
from tests.unit.test_capacity import Message, headers, status_error


def full(capacity: Capacity) -> None:
    """Every place of the window taken (calls wait for one): an answer may widen it."""
    assert capacity.window is not None
    capacity.in_flight = int(-(-capacity.window // 1))


def answer(capacity: Capacity, now: list[float], latency: float = 1.0) -> None:
    full(capacity)
    capacity.answered({}, 100, 20, started_at=now[0] - latency, waited=True)


def test_each_platform_adapter_says_which_signal_its_limiter_learns_from():
    assert providers.PROVIDERS["anthropic"].signals is HEADERS
    assert all(providers.PROVIDERS[name].signals is REFUSALS for name in ("bedrock", "vertex", "foundry"))
    assert providers.of(Settings(model_provider="bedrock")).signals.bare_429_throttles


def test_slow_start_adds_one_call_per_answer_until_the_first_429_then_increase_per_round_trip():
    now = [10.0]
    capacity = new_capacity(clock=showing(now), signals=REFUSALS)
    assert capacity.window == INITIAL_WINDOW and capacity.rate is None  # a cold process: a few calls, no pacing
    for _ in range(6):
        answer(capacity, now)
    assert capacity.window == INITIAL_WINDOW + 6  # doubling per round trip, as TCP's slow start
    capacity.answered(headers(600, 599), 100, 20, started_at=now[0] - 1, waited=True)  # not full: no growth
    assert capacity.window is not None and capacity.rate is None
    pause = refused_once(capacity, None, started_at=now[0] - 0.1)
    assert capacity.window == pytest.approx((INITIAL_WINDOW + 6) * BETA) == capacity.threshold
    assert 0 < pause <= 1.0 and capacity.hold_until == 0.0  # the call pauses alone, the process is not held
    cut = capacity.window
    for _ in range(int(cut) + 1):  # about one round trip of answers: INCREASE calls more
        answer(capacity, now)
    assert cut + INCREASE <= capacity.window < cut + INCREASE * 1.2


def test_a_window_nobody_fills_does_not_grow():
    now = [0.0]
    capacity = new_capacity(clock=showing(now), signals=REFUSALS)
    capacity.in_flight = 1
    capacity.answered({}, 100, 20, started_at=-1.0, waited=False)
    assert capacity.window == INITIAL_WINDOW


def test_429s_cut_the_window_once_per_round_trip_and_never_below_the_floor():
    now = [100.0]
    capacity = new_capacity(clock=showing(now), signals=REFUSALS, rng=random.Random(2))
    capacity.window = 20.0
    refused_once(capacity, None, started_at=99.0)
    refused_once(capacity, None, started_at=99.5)  # started before the cut: by the window before it, no second cut
    assert capacity.window == pytest.approx(20 * BETA)
    for _ in range(30):
        now[0] += 1.0
        refused_once(capacity, None, started_at=now[0])
    assert capacity.window == MIN_WINDOW


def test_a_retry_after_holds_the_process_and_a_bare_throttle_pauses_its_call_longer_each_time():
    now = [100.0]
    capacity = new_capacity(clock=showing(now), signals=REFUSALS, rng=random.Random(5))
    assert refused_once(capacity, 2.0, started_at=99.0) == 0.0  # Foundry's retry-after: honoured, the whole process
    assert 102.0 <= capacity.hold_until <= 102.5 and capacity.delay() >= 2.0
    answer(capacity, now, latency=0.5)  # a round trip measured: 0.5 s
    pauses = [capacity.refused(None, started_at=now[0], in_a_row=n) for n in range(1, 8)]
    assert 0.25 <= pauses[0] <= 0.5 and 0.5 <= pauses[1] <= 1.0  # about a round trip, doubling
    assert max(pauses) <= MAX_BARE_PAUSE_S


async def test_a_bare_429_on_a_platform_waits_and_succeeds_and_on_the_anthropic_api_fails_at_once():
    async def on_wait() -> bool:
        marked.append(True)
        return True

    for name in ("bedrock", "vertex"):
        answers: list = [status_error(429), status_error(429), (Message(), {})]
        marked: list[bool] = []

        async def call(n: int, answers: list = answers):
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

        capacity = new_capacity(signals=providers.PROVIDERS[name].signals, rng=random.Random(1))
        capacity._latency = 0.02  # a round trip measured: the pauses are short
        out = await attempt(call, capacity, time.time() + MARGIN_S + 10, retries=0, on_wait=on_wait)
        assert out.error is None and out.message is not None and out.refusals == 2 and out.attempts == 3, name
        assert marked == [True] and capacity.in_flight == 0 and capacity.hold_until == 0.0

    spent: list = [status_error(429)]

    async def spend_limit(n: int):
        raise spent[0]

    marked = []
    capacity = new_capacity(signals=providers.PROVIDERS["anthropic"].signals)
    out = await attempt(spend_limit, capacity, time.time() + MARGIN_S + 10, retries=3, on_wait=on_wait)
    assert out.error and "(429)" in out.error and not out.busy and out.attempts == 1 and not marked


async def test_a_bare_throttle_whose_pause_would_pass_the_deadline_is_busy_not_an_error():
    async def throttled(n: int):
        raise status_error(429)

    async def on_wait() -> bool:
        return True

    capacity = new_capacity(signals=REFUSALS, rng=random.Random(1))
    capacity._latency = 0.2
    started = time.monotonic()
    out = await attempt(throttled, capacity, time.time() + MARGIN_S + 1.0, retries=0, on_wait=on_wait)
    assert out.busy and "rate limited until the turn's deadline" in (out.error or "") and out.refusals >= 2
    assert time.monotonic() - started < 1.5 and capacity.in_flight == 0


def simulate(replicas: int, seconds: float = 120.0, callers: int = 60) -> tuple[list[Capacity], int, int, int]:
    """`callers` turns' calls in a closed loop, spread over `replicas` limiters, against one bucket admitting 10 calls a
    second and holding 10 (a limit enforced over one second), throttling with a bare 429 (Bedrock's): in simulated
    time, each call answered 1 s ± 30 % after its start, a 429 after 0.05 s. The calls answered and refused after the
    first 10 s, and those answered in the first 10 s."""
    clock = [0.0]
    rng = random.Random(11)
    limiters = [new_capacity(clock=showing(clock), signals=REFUSALS, rng=random.Random(i)) for i in range(replicas)]
    waiting: list[list[int]] = [[] for _ in limiters]  # per limiter, its callers in order (FIFO)
    events: list[tuple[float, int, str, int, float, int]] = []  # (at, seq, kind, caller, started, refusals in a row)
    seq = 0
    bucket, refilled = 10.0, 0.0
    ok = refused = early = 0

    def push(at: float, kind: str, caller: int, started: float = 0.0, in_a_row: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, caller, started, in_a_row))

    def send(caller: int, started: float, in_a_row: int) -> None:
        nonlocal bucket, refilled
        now = clock[0]
        bucket, refilled = min(10.0, bucket + (now - refilled) * 10.0), now
        if bucket >= 1:
            bucket -= 1
            push(now + rng.uniform(0.7, 1.3), "answer", caller, now)
        else:
            push(now + 0.05, "refused", caller, now, in_a_row + 1)

    def start_waiting(r: int) -> None:
        limiter = limiters[r]
        while waiting[r] and limiter.window is not None and limiter.in_flight < limiter.window:
            caller = waiting[r].pop(0)
            limiter.in_flight += 1
            send(caller, clock[0], 0)

    for caller in range(callers):
        waiting[caller % replicas].append(caller)
    for r in range(replicas):
        start_waiting(r)
    while events and events[0][0] < seconds:
        at, _, kind, caller, started, in_a_row = heapq.heappop(events)
        clock[0] = at
        r = caller % replicas
        limiter = limiters[r]
        if kind == "answer":
            limiter.answered({}, 100, 20, started_at=started, waited=bool(waiting[r]))
            limiter.ended()
            ok += at > 10
            early += at <= 10
            waiting[r].append(caller)  # the turn's next call
        elif kind == "refused":  # the call pauses in its place (attempts.py), then tries again in it
            pause = limiter.refused(None, started_at=started, in_a_row=in_a_row)
            refused += at > 10
            push(at + pause, "retry", caller, 0.0, in_a_row)
        else:
            send(caller, at, in_a_row)
        start_waiting(r)
    return limiters, ok, refused, early


def test_a_cold_fleet_against_a_bare_throttle_of_10_calls_a_second_uses_the_limit_with_few_429s():
    """The bar of issue 43's benchmark, on the limiter alone: <= 5 % of calls answered 429 after the first 10 s,
    >= 85 % of the admitted rate used."""
    limiters, ok, refused, _ = simulate(1)
    assert ok / 110 >= 0.85 * 10, (ok / 110, [r.window for r in limiters])
    assert refused <= 0.05 * (ok + refused), (refused, ok)


def test_replicas_adapting_alone_share_the_throttle_equally_and_use_it_with_more_429s():
    """Three replicas, no coordinator: about equal windows, the limit used; each probes on its own, so the aggregate
    window grows three times as fast and meets more 429s than one replica's (docs/operating/capacity.md)."""
    limiters, ok, refused, _ = simulate(3)
    windows = [r.window or 0.0 for r in limiters]
    assert ok / 110 >= 0.85 * 10, (ok / 110, windows)
    assert refused <= 0.2 * (ok + refused), (refused, ok)
    assert max(windows) - min(windows) <= 0.5 * sum(windows) / len(windows) + 1, windows


def test_without_the_cuts_the_same_fleet_meets_a_storm_of_429s():
    """The simulation can fail: a limiter that never narrows its window (a 429 ignored) is refused most of the time."""
    original = Capacity._narrow
    Capacity._narrow = lambda self, started_at: None  # type: ignore[method-assign]
    try:
        _, ok, refused, _ = simulate(1, seconds=40.0)
    finally:
        Capacity._narrow = original  # type: ignore[method-assign]
    assert refused > 0.2 * (ok + refused), (refused, ok)


async def test_a_hold_that_comes_during_a_throttled_calls_pause_is_waited_for_and_its_place_given_back():
    capacity = new_capacity(signals=REFUSALS, rng=random.Random(4))
    capacity._latency = 0.1  # its pause: 0.05-0.1 s
    answers: list = [status_error(429), (Message(), {})]

    async def call(n: int):
        answer = answers.pop(0)
        if isinstance(answer, Exception):  # another call's 429 with retry-after comes while this one pauses
            asyncio.get_running_loop().call_later(0.01, refused_once, capacity, 0.4, time.monotonic())
            raise answer
        return answer

    async def on_wait() -> bool:
        return True

    started = time.monotonic()
    out = await attempt(call, capacity, time.time() + MARGIN_S + 10, retries=0, on_wait=on_wait)
    assert out.error is None and out.attempts == 2 and time.monotonic() - started >= 0.4
    assert capacity.in_flight == 0
