"""529 `overloaded_error` bursts on demand or on a period: the API is overloaded for everyone for a while, then is
not. During a burst every request is answered before it is admitted (it costs no rate limit) and, like the API's,
without `retry-after`."""

from __future__ import annotations

from roundtrip._kernel.clock import Clock

from .errors import ApiError

MESSAGES = {
    529: "Overloaded (simulated burst).",
    500: "Internal server error (simulated burst).",
    502: "Bad gateway (simulated burst).",
    503: "Service unavailable (simulated burst).",
    504: "Gateway timeout (simulated burst).",
    # errors that are not about capacity, for a while (a key revoked, a request the API stopped taking)
    400: "Invalid request (simulated burst).",
    401: "invalid x-api-key (simulated burst).",
}


class Overload:
    def __init__(self, clock: Clock, every: float | None = None, seconds: float = 5.0):
        if (every is not None and every <= 0) or seconds <= 0:
            raise ValueError("overload every and seconds must be positive")
        self._every, self._seconds, self._clock = every, seconds, clock
        self._origin = clock.monotonic()
        self._until = -1.0
        self._status = 529
        self.answered = 0

    def start(self, seconds: float, status: int = 529) -> None:
        """A burst of `status` from now for `seconds`; 0 ends the one started on demand."""
        if status not in MESSAGES:
            raise ValueError(f"a burst answers one of {', '.join(map(str, MESSAGES))}, not {status}")
        self._until, self._status = self._clock.monotonic() + seconds, status

    def status(self) -> int | None:
        """The status of the burst under way (None: no burst)."""
        now = self._clock.monotonic()
        if now < self._until:
            return self._status
        elapsed = now - self._origin
        periodic = self._every is not None and elapsed >= self._every and elapsed % self._every < self._seconds
        return 529 if periodic else None

    def check(self) -> None:
        """Raise the error of a burst under way."""
        if (status := self.status()) is not None:
            self.answered += 1
            raise ApiError(status, MESSAGES[status])
