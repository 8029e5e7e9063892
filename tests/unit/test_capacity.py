"""The model service's limiter (services/_model/capacity.py) and its retries (services/_model/attempts.py), with fakes.

The limiter is driven by what an API following Anthropic's rules would answer: a bucket refilled continuously
at the per-minute limit, `anthropic-ratelimit-*` headers on every answer, a 429 with retry-after when empty.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time

import anthropic
import httpx
import pytest

from roundtrip._model.attempts import MARGIN_S, attempt
from roundtrip._model.capacity import BETA, EPOCH_S, INITIAL_WINDOW, Busy, Capacity, Reading
from tests.clocks import showing
from tests.cores import new_capacity, refused_once


def headers(limit: float, remaining: float, dimension: str = "requests") -> dict[str, str]:
    return {
        f"anthropic-ratelimit-{dimension}-limit": str(limit),
        f"anthropic-ratelimit-{dimension}-remaining": str(remaining),
    }


def status_error(status: int, extra: dict[str, str] | None = None) -> anthropic.APIStatusError:
    request = httpx.Request("POST", "http://api/v1/messages")
    response = httpx.Response(status, headers=extra or {}, request=request, json={"type": "error"})
    cls = {400: anthropic.BadRequestError, 401: anthropic.AuthenticationError, 429: anthropic.RateLimitError}.get(
        status, anthropic.APIStatusError
    )
    return cls(f"error {status}", response=response, body=None)


class Usage:
    input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens = 100, 20, 0, 5000


class Message:
    usage = Usage()


def test_the_headers_are_read_per_dimension_and_junk_is_ignored():
    reading = Reading.of(
        {
            **headers(600, 590),
            "anthropic-ratelimit-input-tokens-limit": "junk",
            "anthropic-ratelimit-output-tokens-remaining": "80",
        }
    )
    assert reading.limit == {"requests": 600.0} and reading.remaining == {"requests": 590.0, "output-tokens": 80.0}


def test_the_first_rate_is_the_ceiling_of_the_headers_and_tokens_count_like_the_api():
    capacity = new_capacity()
    capacity.answered(headers(600, 599), input_tokens=100, output_tokens=20, started_at=0.0, waited=False)
    assert capacity.rate == pytest.approx(10.0)  # 600 requests a minute
    tokens = new_capacity()
    # 120k input tokens a minute; a call counts its uncached input and cache writes (here 1000), not its cache reads
    tokens.answered(
        headers(120_000, 119_000, "input-tokens"), input_tokens=1000, output_tokens=20, started_at=0.0, waited=False
    )
    assert tokens.rate == pytest.approx(2.0)


def test_a_429_cuts_the_rate_once_per_epoch_and_holds_the_whole_process():
    now = [100.0]
    capacity = new_capacity(clock=showing(now), rng=random.Random(1))
    capacity.answered(headers(600, 599), 100, 20, started_at=99.0, waited=False)

    async def refuse_twice():
        refused_once(capacity, 1.0, started_at=99.5)
        refused_once(capacity, 1.0, started_at=99.6)  # the same burst: no second cut

    asyncio.run(refuse_twice())
    assert capacity.rate == pytest.approx(10.0 * BETA)
    assert 101.0 <= capacity.hold_until <= 101.0 + 0.25 + 1 / capacity.rate  # retry-after plus this process's jitter
    assert capacity.delay() >= 1.0 and capacity.throttled


def test_a_draining_bucket_cuts_before_any_429_and_room_ramps_the_rate_back():
    now = [0.0]
    capacity = new_capacity(clock=showing(now))
    capacity.answered(headers(600, 600), 100, 20, started_at=0.0, waited=False)
    for _ in range(9):  # an epoch in which all but the first answer found the bucket below half: someone drains it
        capacity.answered(headers(600, 200), 100, 20, started_at=0.0, waited=False)
    now[0] = EPOCH_S
    capacity.answered(headers(600, 200), 100, 20, started_at=0.0, waited=False)
    assert capacity.rate == pytest.approx(10.0 * (1 - 10 / 11 * (1 - BETA)))  # 10 answers of 11 drained, no 429 yet
    for epoch in range(2, 40):
        now[0] = epoch * EPOCH_S
        capacity.answered(headers(600, 500), 100, 20, started_at=now[0], waited=True)
    assert capacity.rate == pytest.approx(10.0)  # back to the ceiling, never above it


async def test_waiting_calls_start_one_slot_apart_in_order_and_busy_past_the_deadline():
    capacity = new_capacity()
    capacity.rate = 20.0  # 50 ms apart
    starts: list[float] = []

    async def one() -> None:
        await capacity.acquire(time.monotonic() + 10)
        starts.append(time.monotonic())
        capacity.ended()

    await asyncio.gather(*(one() for _ in range(5)))
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap > 0.03 for gap in gaps), gaps
    with pytest.raises(Busy):
        capacity.rate = 0.1  # the next slot is 10 s away
        await capacity.acquire(time.monotonic() + 0.5)
        await capacity.acquire(time.monotonic() + 0.5)


def test_replicas_adapting_alone_converge_on_sharing_one_limit():
    """Three limiters against one bucket (600 a minute, refilled continuously, 429 when empty), in simulated time:
    after the start the replicas' rates sum to about the limit, their shares equal, with few 429s."""
    dt, limit, capacity_ = 0.01, 10.0, 20.0  # 10 calls/s; a bucket of 2 s of them
    clock = [0.0]
    replicas = [new_capacity(clock=showing(clock), rng=random.Random(i)) for i in range(3)]
    for r in replicas:
        r.rate = limit * (0.5 + i) if (i := replicas.index(r)) else 1.0  # unequal starts: 1, 15, 25 calls/s
    bucket, credit, ok, refused = capacity_, [0.0] * 3, 0, 0
    if True:
        for tick in range(int(120 / dt)):
            clock[0] = tick * dt
            bucket = min(capacity_, bucket + limit * dt)
            for i, r in enumerate(replicas):
                if r.hold_until > clock[0]:
                    continue
                credit[i] += r.rate * dt
                while credit[i] >= 1:
                    credit[i] -= 1
                    if bucket >= 1:
                        bucket -= 1
                        ok += tick * dt > 60
                        r.answered(
                            {
                                "anthropic-ratelimit-requests-limit": "600",
                                "anthropic-ratelimit-requests-remaining": str(int(bucket * 30)),
                            },
                            100,
                            20,
                            clock[0],
                            True,
                        )
                    else:
                        refused += tick * dt > 60
                        refused_once(r, 1.0, clock[0])
    rates = [r.rate for r in replicas]
    assert ok / 60 >= 0.85 * limit, (ok / 60, rates)  # the second minute: the limit used
    assert refused <= 0.05 * (ok + refused), (refused, ok)
    assert max(rates) - min(rates) < 0.5 * limit, rates  # about equal shares, no coordinator


async def test_capacity_refusals_wait_and_errors_that_are_not_about_capacity_end_at_once():
    answers = [status_error(429, {"retry-after": "0.05"}), status_error(529), (Message(), {})]
    calls: list[int] = []
    marked: list[bool] = []

    async def call(n: int):
        calls.append(n)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def on_wait() -> bool:
        marked.append(True)
        return True

    capacity = new_capacity()
    out = await attempt(call, capacity, time.time() + MARGIN_S + 10, retries=0, on_wait=on_wait)
    assert out.error is None and out.refusals == 2 and out.attempts == 3 and calls == [0, 1, 2] and marked == [True]
    for status, extra in ((400, None), (401, None), (429, None)):  # a 429 without retry-after: a spend limit
        answers[:] = [status_error(status, extra)]
        out = await attempt(call, new_capacity(), time.time() + MARGIN_S + 10, retries=3, on_wait=on_wait)
        assert out.error and not out.busy and out.attempts == 1 and f"({status})" in out.error


async def test_a_plain_loop_takes_a_capacity_refusal_as_the_error_and_holds_nothing():
    """wait_for_capacity off (the benchmark's plain loop): the 429 its SDK gave up on ends the call at once."""
    calls: list[int] = []

    async def refused(n: int):
        calls.append(n)
        raise status_error(429, {"retry-after": "1"})

    async def on_wait() -> bool:
        return True

    capacity = new_capacity()
    out = await attempt(
        refused, capacity, time.time() + MARGIN_S + 10, retries=0, on_wait=on_wait, wait_for_capacity=False
    )
    assert out.error and "(429)" in out.error and not out.busy and out.attempts == 1 and calls == [0]
    assert capacity.delay() == 0.0  # the process is not held: the next call goes at once


async def test_a_turn_that_ended_while_its_call_waited_is_not_called():
    capacity = new_capacity()
    capacity.rate = 0.5  # the next slot 2 s away

    async def never(n: int):
        raise AssertionError("called")

    async def ended() -> bool:
        return False

    await capacity.acquire(time.monotonic() + 5)
    out = await attempt(never, capacity, time.time() + MARGIN_S + 10, retries=0, on_wait=ended)
    assert out.gone and out.attempts == 0


async def started_after(capacity: Capacity, tasks: list[asyncio.Task], rounds: int = 5) -> int:
    """How many of `tasks` (each an acquire) have been let start, once the loop has run a little."""
    for _ in range(rounds):
        await asyncio.sleep(0.002)  # a loop turn or two: the granted acquires complete
    return sum(task.done() for task in tasks)


async def test_a_cold_limiter_starts_a_few_calls_and_an_answer_announcing_no_limit_opens_it():
    capacity = new_capacity()
    tasks = [asyncio.create_task(capacity.acquire(time.monotonic() + 10)) for _ in range(20)]
    assert await started_after(capacity, tasks) == INITIAL_WINDOW and capacity.in_flight == INITIAL_WINDOW
    capacity.answered({}, 100, 20, started_at=time.monotonic() - 1.0, waited=False)  # no rate-limit header at all
    capacity.ended()
    assert await started_after(capacity, tasks) == 20 and capacity.window is None and capacity.rate is None


async def test_each_answer_with_room_lets_two_calls_start_and_the_window_opens_at_what_the_rate_keeps_in_flight():
    capacity = new_capacity()
    tasks = [asyncio.create_task(capacity.acquire(time.monotonic() + 10)) for _ in range(40)]
    started = await started_after(capacity, tasks)
    assert started == INITIAL_WINDOW
    # 6,000 requests a minute: 100 calls/s; answers 0.05 s after their start: the rate keeps 5 in flight, and the
    # window opens when it holds OPEN_AFTER times that (10)
    capacity.answered(headers(6000, 5999), 100, 20, started_at=time.monotonic() - 0.05, waited=False)
    capacity.ended()
    assert await started_after(capacity, tasks) == started + 2  # its own place and one more
    started += 2
    capacity.answered(headers(6000, 2000), 100, 20, started_at=time.monotonic() - 0.05, waited=False)  # drained
    capacity.ended()
    assert await started_after(capacity, tasks) == started + 1  # its own place only: the window did not grow
    started += 1
    windows = []
    while capacity.window is not None:
        windows.append(capacity.window)
        capacity.answered(headers(6000, 5999), 100, 20, started_at=time.monotonic() - 0.05, waited=False)
        capacity.ended()
    # one more per answer, open once it holds about OPEN_AFTER x 100/s x 0.05 s (the latency measured is a little more)
    assert windows == list(range(INITIAL_WINDOW + 1, windows[-1] + 1)) and windows[-1] in (9, 10), windows
    await asyncio.wait_for(asyncio.gather(*tasks), 5)  # open: the rate alone paces the rest (100/s)


async def test_a_429_starts_slow_again_from_the_end_of_its_hold():
    capacity = new_capacity(rng=random.Random(3))
    capacity.answered({}, 100, 20, started_at=time.monotonic(), waited=False)  # open
    capacity.answered(headers(60000, 59000), 100, 20, started_at=time.monotonic() - 1.0, waited=False)
    assert capacity.window is None
    refused_once(capacity, 0.05, started_at=time.monotonic())
    assert capacity.window == INITIAL_WINDOW
    tasks = [asyncio.create_task(capacity.acquire(time.monotonic() + 10)) for _ in range(12)]
    await asyncio.sleep(0.2)  # the hold has ended
    assert sum(task.done() for task in tasks) == INITIAL_WINDOW
    for task in tasks:  # the rest would wait out their deadline after the test, their Busy never read
        task.cancel()


async def test_a_call_waiting_for_room_in_the_window_is_busy_at_its_deadline_and_gives_no_place_away():
    capacity = new_capacity()
    for _ in range(INITIAL_WINDOW):
        await capacity.acquire(time.monotonic() + 10)
    with pytest.raises(Busy):
        await capacity.acquire(time.monotonic() + 0.05)
    assert capacity.in_flight == INITIAL_WINDOW and capacity.waiting == 0
    capacity.ended()
    await asyncio.wait_for(capacity.acquire(time.monotonic() + 1), 1)  # the place it gave back goes on


async def test_a_cold_fleet_against_a_bucket_of_a_tenth_of_a_second_is_refused_little():
    """60 callers in a closed loop (each call answered after 0.1 s ± 30 %) against 6,000 requests a minute enforced
    over 0.1 s (a bucket of 10, refilled at 100 a second): without slow start the first wave alone meets 50 429s;
    with it, only a few calls start before the first answer's headers give the rate."""

    async def run(slow_start: bool) -> tuple[int, int]:
        bucket, at, ok, refused = [10.0], [time.monotonic()], [0], [0]
        rng = random.Random(7)

        async def call(n: int):
            await asyncio.sleep(0.01)  # the request's way to the API: a 429 comes back no sooner than this
            now = time.monotonic()
            bucket[0], at[0] = min(10.0, bucket[0] + (now - at[0]) * 100), now
            if bucket[0] < 1:
                refused[0] += 1
                raise status_error(429, {"retry-after-ms": "100"})
            bucket[0] -= 1
            await asyncio.sleep(0.1 * rng.uniform(0.7, 1.3))  # the simulated call's time at the API, jittered
            ok[0] += 1
            return Message(), headers(6000, int(bucket[0]))

        async def on_wait() -> bool:
            return True

        capacity = new_capacity(rng=random.Random(1), slow_start=slow_start)
        stop = time.monotonic() + 1.5

        async def caller() -> None:
            while time.monotonic() < stop:
                await attempt(call, capacity, time.time() + MARGIN_S + 10, retries=0, on_wait=on_wait)

        await asyncio.gather(*(caller() for _ in range(60)))
        return ok[0], refused[0]

    ok, refused = await run(slow_start=True)
    unpaced_ok, unpaced_refused = await run(slow_start=False)
    assert unpaced_refused >= 40, (unpaced_ok, unpaced_refused)  # the burst the slow start avoids
    assert refused <= 0.05 * (ok + refused), (ok, refused)


def test_a_minute_of_529s_holds_the_process_each_time_and_leaves_the_rate_the_headers_gave():
    """The API overloaded for everyone a whole minute: every 529 holds the process for its pause, none cuts the rate,
    so the calls waiting go on at the announced rate the moment it ends (cut once an epoch, the rate would reach its
    floor, a call every 20 s, and the fleet stall for minutes after the burst)."""
    now = [100.0]
    capacity = new_capacity(clock=showing(now), rng=random.Random(3))
    capacity.answered(headers(600, 599), 100, 20, started_at=99.0, waited=False)

    async def a_minute_of_529s():
        while now[0] < 160.0:
            refused_once(capacity, 1.0, started_at=now[0] - 0.5, overloaded=True)
            assert capacity.hold_until >= now[0] + 1.0  # the process waits out the overload
            now[0] += 1.5

    asyncio.run(a_minute_of_529s())
    assert capacity.rate == pytest.approx(10.0) and capacity.refusals == 40
    assert capacity.delay() <= 1.0 + 0.25 + 0.1  # what is left of the last hold: then a call each 0.1 s again
    refused_once(capacity, 1.0, started_at=now[0] - 0.5)  # a 429 still cuts
    assert capacity.rate == pytest.approx(10.0 * BETA)
