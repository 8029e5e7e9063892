"""529 `overloaded_error` bursts on demand: the API is overloaded for everyone for a while, then is not.

A burst is started by POST /v1/_overload {"seconds": N} (now, for N seconds), or comes back on its
own every `every` seconds for `seconds` each (ROUNDTRIP_SIMULATOR_OVERLOAD_EVERY / _SECONDS; the
first one `every` seconds after the start). During a burst every /v1/messages request is answered
529 before it is admitted (it costs no rate limit) and, like the API's, without `retry-after`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .errors import ApiError

MESSAGE = "Overloaded (simulated burst)."


class Overload:
    def __init__(self, every: float | None = None, seconds: float = 5.0, clock: Callable[[], float] = time.monotonic):
        if every is not None and every <= 0 or seconds <= 0:
            raise ValueError("overload every and seconds must be positive")
        self._every, self._seconds, self._clock = every, seconds, clock
        self._origin = clock()
        self._until = -1.0
        self.answered = 0  # requests answered 529 by a burst

    def start(self, seconds: float) -> None:
        """A burst from now for `seconds` (a burst under way lasts at least as long as it would have)."""
        self._until = max(self._until, self._clock() + seconds)

    def active(self) -> bool:
        now = self._clock()
        if now < self._until:
            return True
        elapsed = now - self._origin
        return self._every is not None and elapsed >= self._every and elapsed % self._every < self._seconds

    def check(self) -> None:
        """Raise the 529 of a burst under way."""
        if self.active():
            self.answered += 1
            raise ApiError(529, MESSAGE)
