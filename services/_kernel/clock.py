"""The clock a core reads, as a port: the fleet runs on the process's clocks, `SYSTEM`; a harness may move its own."""

from __future__ import annotations

import time
from typing import Final, Protocol


class Clock(Protocol):
    def time(self) -> float: ...  # the wall clock: what other processes and the database compare
    def monotonic(self) -> float: ...  # durations within this process


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM: Final = SystemClock()
