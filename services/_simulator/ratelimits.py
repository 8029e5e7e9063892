"""Rate limits enforced like the Messages API's: requests, input tokens and output tokens per minute.

Each limit is a token bucket refilled continuously at limit/60 per second, not reset each minute; a request is
admitted only if every bucket holds what it costs, else refused with the API's 429 and `retry-after`. Output tokens
are taken as max_tokens up front and the unused part given back at the end, as the API estimates OTPM. `burst_s`
enforces a limit over a shorter interval. The rules: docs/decisions/simulator.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from roundtrip._kernel.clock import Clock

from .errors import ApiError
from .usage import PromptCache

KINDS = {"rpm": "requests", "itpm": "input-tokens", "otpm": "output-tokens"}
UNITS = {"requests": "requests", "input-tokens": "input tokens", "output-tokens": "output tokens"}
HEADER = "anthropic-ratelimit-"


MINUTE_S = 60.0


@dataclass
class Bucket:
    """At most `limit` x burst_s / 60 (a minute's limit by default), refilled at limit/60 per second."""

    limit: int
    level: float
    at: float
    burst_s: float = MINUTE_S

    @property
    def holds(self) -> float:
        return self.limit * self.burst_s / MINUTE_S

    def refill(self, now: float) -> None:
        self.level = min(self.holds, self.level + (now - self.at) * self.limit / MINUTE_S)
        self.at = now

    def wait(self, amount: float) -> float:
        """Seconds until the bucket holds `amount` (0: now; inf: never, it is more than the bucket holds)."""
        if amount > self.holds:
            return math.inf
        return max(0.0, (amount - self.level) * MINUTE_S / self.limit)

    def until_full(self) -> float:
        return (self.holds - self.level) * MINUTE_S / self.limit


class Admitted:
    """An admitted call: `with` it around the work; `produced(n)` says how many output tokens it used."""

    def __init__(self, limits: RateLimits, max_tokens: int):
        self._limits, self._reserved, self._used = limits, max_tokens, 0

    def produced(self, output_tokens: int) -> None:
        self._used = output_tokens

    def __enter__(self) -> Admitted:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._limits.in_flight -= 1
        self._limits.give_back("output-tokens", self._reserved - (0 if kind else self._used))


class RateLimits:
    """The simulator's buckets, the headers they announce and the 429s they answer."""

    def __init__(self, clock: Clock, rpm: int | None = None, itpm: int | None = None, otpm: int | None = None):
        self._clock = clock
        self._buckets: dict[str, Bucket] = {}
        self.burst_s = MINUTE_S
        self.refused = 0
        self.in_flight = 0
        self.configure({"rpm": rpm, "itpm": itpm, "otpm": otpm})

    def configure(self, limits: dict[str, float | None]) -> None:
        """Set, change (None: remove) the limits named: {"rpm": 300} halves a limit of 600, the rest unchanged;
        {"burst_s": 1} enforces every limit over one second (None: a minute again)."""
        now = self._refill()
        limits = dict(limits)
        if "burst_s" in limits:
            self.burst_s = limits.pop("burst_s") or MINUTE_S
        for bucket in self._buckets.values():
            bucket.burst_s = self.burst_s
            bucket.level = min(bucket.level, bucket.holds)
        for name, limit in limits.items():
            kind = KINDS[name]
            if limit is None:
                self._buckets.pop(kind, None)
            elif kind in self._buckets:
                bucket = self._buckets[kind]
                bucket.limit = int(limit)
                bucket.level = min(bucket.level, bucket.holds)
            else:
                bucket = self._buckets[kind] = Bucket(int(limit), 0.0, now, self.burst_s)
                bucket.level = bucket.holds

    def admit(self, body: dict[str, Any], cache: PromptCache) -> Admitted:
        """Take what this request costs from every bucket, or raise the API's 429."""
        usage = cache.input_usage(body, commit=False)
        cost = {
            "requests": 1,
            "input-tokens": usage["input_tokens"] + usage["cache_creation_input_tokens"],
            "output-tokens": body["max_tokens"],
        }
        self._refill()
        waits = {kind: bucket.wait(cost[kind]) for kind, bucket in self._buckets.items()}
        short = {kind: wait for kind, wait in waits.items() if wait > 0}
        if short:
            self.refused += 1
            raise self._refusal(max(short, key=short.__getitem__), max(short.values()))
        for kind, bucket in self._buckets.items():
            bucket.level -= cost[kind]
        self.in_flight += 1
        return Admitted(self, body["max_tokens"] if "output-tokens" in self._buckets else 0)

    def give_back(self, kind: str, amount: float) -> None:
        if kind in self._buckets and amount > 0:
            self._refill()
            bucket = self._buckets[kind]
            bucket.level = min(float(bucket.limit), bucket.level + amount)

    def headers(self) -> dict[str, str]:
        """The anthropic-ratelimit-* headers of the limits that are set, as of now."""
        self._refill()
        headers: dict[str, str] = {}
        for kind, bucket in self._buckets.items():
            headers.update(self._announce(kind, bucket))
        tokens = [b for k, b in self._buckets.items() if k != "requests"]
        if tokens:
            headers.update(self._announce("tokens", min(tokens, key=lambda b: b.level / b.limit)))
        return headers

    def snapshot(self) -> dict[str, Any]:
        """The limits and what each bucket holds (GET /v1/_limits), and how many requests were refused."""
        self._refill()
        names = {kind: name for name, kind in KINDS.items()}
        return {
            "limits": {names[k]: b.limit for k, b in self._buckets.items()},
            "remaining": {names[k]: math.floor(b.level) for k, b in self._buckets.items()},
            "burst_s": self.burst_s,
            "refused": self.refused,
        }

    def _refill(self) -> float:
        now = self._clock.monotonic()
        for bucket in self._buckets.values():
            bucket.refill(now)
        return now

    def _announce(self, kind: str, bucket: Bucket) -> dict[str, str]:
        reset = datetime.fromtimestamp(math.ceil(self._clock.time() + bucket.until_full()), tz=UTC)
        return {
            f"{HEADER}{kind}-limit": str(bucket.limit),
            f"{HEADER}{kind}-remaining": str(max(0, math.floor(bucket.level))),
            f"{HEADER}{kind}-reset": reset.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    def _refusal(self, kind: str, wait: float) -> ApiError:
        limit = self._buckets[kind].limit
        if math.isinf(wait):
            return ApiError(
                429,
                f"This request alone exceeds your organization's rate limit of {limit:,} "
                f"{UNITS[kind]} per minute (simulated). Please reduce the prompt length or the "
                "maximum tokens requested.",
            )
        return ApiError(
            429,
            f"This request would exceed your organization's rate limit of {limit:,} {UNITS[kind]} per "
            "minute (simulated). You can see the response headers for current usage. Please reduce "
            "the prompt length or the maximum tokens requested, or try again later.",
            headers={"retry-after": str(max(1, math.ceil(wait)))},
        )
