"""A clock a test moves by hand (the kernel's `Clock` port): both readings are what `read()` says."""

from __future__ import annotations

from collections.abc import Callable


class HandClock:
    def __init__(self, read: Callable[[], float]) -> None:
        self.read = read

    def time(self) -> float:
        return self.read()

    def monotonic(self) -> float:
        return self.read()


def showing(now: list[float]) -> HandClock:
    """A clock showing `now[0]`: the test moves it by changing the list."""
    return HandClock(lambda: now[0])
