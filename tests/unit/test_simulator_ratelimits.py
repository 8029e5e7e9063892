"""The simulator's rate limits and 529 bursts, on a fake clock: buckets refilled continuously like the API's."""

from __future__ import annotations

import pytest

from roundtrip._kernel.clock import SYSTEM
from roundtrip._simulator.errors import ApiError
from roundtrip._simulator.overload import Overload
from roundtrip._simulator.ratelimits import RateLimits
from roundtrip._simulator.usage import PromptCache, estimate_tokens, prompt_of

WALL = 1_800_000_000.0  # 2027-01-15T08:00:00Z


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return WALL + self.now


def body(text: str = "hello", max_tokens: int = 100, **extra) -> dict:
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def limits(clock: Clock, **kw) -> RateLimits:
    return RateLimits(clock, **kw)


def admit(rl: RateLimits, request: dict, cache: PromptCache | None = None, produced: int = 0) -> None:
    with rl.admit(request, cache or PromptCache(SYSTEM)) as call:
        call.produced(produced)


def refusal(rl: RateLimits, request: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        rl.admit(request, PromptCache(SYSTEM))
    return caught.value


def test_requests_bucket_refills_continuously_not_per_minute():
    clock = Clock()
    rl = limits(clock, rpm=60)  # one request a second
    for _ in range(60):
        admit(rl, body())
    error = refusal(rl, body())
    assert error.status == 429 and error.error_type == "rate_limit_error"
    assert error.headers["retry-after"] == "1"
    assert "60 requests per minute" in error.message
    clock.now = 0.5
    refusal(rl, body())  # half a request refilled
    clock.now = 1.0
    admit(rl, body())  # one second later exactly one more, not a whole new minute
    refusal(rl, body())
    assert rl.refused == 3


def test_headers_name_limit_remaining_and_reset_of_each_limit_set():
    clock = Clock()
    rl = limits(clock, rpm=600, itpm=10_000)
    assert "anthropic-ratelimit-output-tokens-limit" not in rl.headers()  # a limit not set is not announced
    for _ in range(6):
        admit(rl, body())
    headers = rl.headers()
    assert headers["anthropic-ratelimit-requests-limit"] == "600"
    assert headers["anthropic-ratelimit-requests-remaining"] == "594"
    assert (
        headers["anthropic-ratelimit-requests-reset"] == "2027-01-15T08:00:01Z"
    )  # 6 requests at 10/s: 0.6 s, rounded up
    assert headers["anthropic-ratelimit-input-tokens-limit"] == "10000"
    spent = 6 * estimate_tokens(prompt_of(body()))
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == str(10_000 - spent)
    assert headers["anthropic-ratelimit-tokens-limit"] == "10000"  # the only token limit is the nearest to running out


def test_retry_after_is_the_whole_seconds_until_the_shortest_bucket_holds_enough():
    clock = Clock()
    rl = limits(clock, itpm=600)  # 10 tokens a second
    big = body("x" * 1600)  # about 400 tokens
    cost = estimate_tokens(prompt_of(big))
    admit(rl, big)
    error = refusal(rl, big)  # holds 600 - cost, needs cost
    assert error.headers["retry-after"] == str(-(-(2 * cost - 600) // 10))
    assert "600 input tokens per minute" in error.message


def test_a_request_larger_than_the_whole_limit_has_no_retry_after():
    rl = limits(Clock(), otpm=1000)
    error = refusal(rl, body(max_tokens=2000))
    assert error.status == 429 and "retry-after" not in error.headers
    assert "alone exceeds" in error.message


def test_output_tokens_are_reserved_as_max_tokens_then_the_unused_part_given_back():
    clock = Clock()
    rl = limits(clock, otpm=1000)
    with rl.admit(body(max_tokens=800), PromptCache(SYSTEM)) as call:
        assert rl.in_flight == 1
        assert rl.headers()["anthropic-ratelimit-output-tokens-remaining"] == "200"  # max_tokens taken up front
        refusal(rl, body(max_tokens=300))
        call.produced(50)
    assert rl.headers()["anthropic-ratelimit-output-tokens-remaining"] == "950" and rl.in_flight == 0


def test_a_call_that_fails_after_admission_gives_all_its_output_tokens_back():
    rl = limits(Clock(), otpm=1000)
    with pytest.raises(RuntimeError), rl.admit(body(max_tokens=800), PromptCache(SYSTEM)) as call:
        call.produced(50)
        raise RuntimeError("fault")
    assert rl.headers()["anthropic-ratelimit-output-tokens-remaining"] == "1000"


def test_cache_reads_do_not_count_toward_input_tokens_and_admission_writes_no_cache():
    clock = Clock()
    cache = PromptCache(clock)
    cached = body(system=[{"type": "text", "text": "policy " * 1500, "cache_control": {"type": "ephemeral"}}])
    first = cache.input_usage(cached, commit=False)
    assert first["cache_creation_input_tokens"] > 1024
    refusal(limits(clock, itpm=1000), cached)  # a refused request...
    rl = limits(clock, itpm=100_000)
    admit(rl, cached, cache)  # ...and an admitted one only look: the response writes the cache
    assert cache.input_usage(cached, commit=False) == first
    assert rl.snapshot()["remaining"]["itpm"] == 100_000 - first["input_tokens"] - first["cache_creation_input_tokens"]
    cache.input_usage(cached)  # the response of the first call wrote the prefix
    before = rl.snapshot()["remaining"]["itpm"]
    admit(rl, cached, cache)
    read = cache.input_usage(cached, commit=False)
    assert read["cache_read_input_tokens"] > 1024
    assert before - rl.snapshot()["remaining"]["itpm"] == read["input_tokens"]  # the read prefix cost nothing


def test_configure_halves_a_limit_mid_run_keeping_at_most_the_new_limit():
    clock = Clock()
    rl = limits(clock, rpm=600)
    admit(rl, body())
    rl.configure({"rpm": 300})
    snapshot = rl.snapshot()
    assert snapshot["limits"] == {"rpm": 300} and snapshot["remaining"] == {"rpm": 300}
    for _ in range(300):
        admit(rl, body())
    refusal(rl, body())
    clock.now = 0.2  # 300/min refills 5 a second: one request in 0.2 s
    admit(rl, body())
    rl.configure({"rpm": None, "itpm": 5000})
    assert rl.snapshot()["limits"] == {"itpm": 5000}


def test_no_limit_admits_everything_and_announces_nothing():
    rl = limits(Clock())
    for _ in range(1000):
        admit(rl, body(max_tokens=100_000))
    assert rl.headers() == {}


def test_overload_burst_on_demand_and_every_period():
    clock = Clock()
    on_demand = Overload(clock)
    on_demand.check()
    on_demand.start(3)
    clock.now = 2.9
    with pytest.raises(ApiError) as caught:
        on_demand.check()
    assert caught.value.status == 529 and caught.value.error_type == "overloaded_error" and not caught.value.headers
    clock.now = 3.0
    on_demand.check()
    assert on_demand.answered == 1
    on_demand.start(60, status=500)
    assert on_demand.status() == 500
    on_demand.start(0)  # ends it
    assert on_demand.status() is None

    clock.now = 0.0
    periodic = Overload(clock, every=10, seconds=2)
    states = []
    for t in (0, 5, 9.9, 10, 11.9, 12, 20.5, 25):
        clock.now = t
        states.append(periodic.status() == 529)
    assert states == [False, False, False, True, True, False, True, False]


def test_overload_refuses_nonsense():
    with pytest.raises(ValueError):
        Overload(SYSTEM, every=0)
    with pytest.raises(ValueError):
        Overload(SYSTEM).start(5, status=404)


def test_a_limit_enforced_over_one_second_refuses_a_burst_the_minute_would_allow():
    clock = Clock()
    rl = limits(clock, rpm=600)
    rl.configure({"burst_s": 1})  # 600 a minute as 10 a second: the bucket holds 10
    for _ in range(10):
        admit(rl, body())
    error = refusal(rl, body())
    assert error.headers["retry-after"] == "1" and rl.snapshot()["remaining"] == {"rpm": 0}
    clock.now = 0.5
    admit(rl, body())  # 5 refilled in half a second
    assert rl.headers()["anthropic-ratelimit-requests-limit"] == "600"  # the per-minute limit is still announced
    clock.now = 100.0
    assert rl.snapshot()["remaining"] == {"rpm": 10}  # never more than a second's refill
    rl.configure({"burst_s": None})
    clock.now = 200.0
    assert rl.snapshot()["remaining"] == {"rpm": 600} and rl.snapshot()["burst_s"] == 60.0
