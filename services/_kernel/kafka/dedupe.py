"""A bounded memory of ids already handled: the cheap first line against redelivery."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from roundtrip._kernel.clock import Clock


class SeenIds:
    """The last `capacity` keys seen, each with a value remembered for it. `max_age_s` also forgets keys unseen that
    long, so memory follows the rate instead of growing for hours towards `capacity` at a slow one."""

    def __init__(self, clock: Clock, capacity: int = 100_000, max_age_s: float | None = None) -> None:
        self._ids: OrderedDict[str, tuple[Any, float]] = OrderedDict()
        self._capacity, self._max_age_s, self._clock = capacity, max_age_s, clock

    def add(self, key: str) -> bool:
        """Remember `key`; False when it was already there (a duplicate)."""
        return self.first(key, True) is None

    def first(self, key: str, value: Any) -> Any:
        """Remember `value` for a new `key` and return None; for a key seen before, the value first remembered."""
        if key in self._ids:
            return self.get(key)
        now = self._clock.monotonic()
        self._ids[key] = (value, now)
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        if self._max_age_s is not None:
            too_old = now - self._max_age_s
            while self._ids and next(iter(self._ids.values()))[1] < too_old:
                self._ids.popitem(last=False)
        return None

    def get(self, key: str) -> Any:
        """The value remembered for `key` (None: not remembered), its age renewed: a key in use is kept."""
        if (seen := self._ids.get(key)) is None:
            return None
        self._ids[key] = (seen[0], self._clock.monotonic())
        self._ids.move_to_end(key)
        return seen[0]

    def __contains__(self, key: str) -> bool:
        return key in self._ids

    def __len__(self) -> int:
        return len(self._ids)
