"""A bounded memory of ids already handled: the cheap first line against redelivery."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class SeenIds:
    """The last `capacity` keys seen (the least recently seen go first), each with a value remembered for it."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._ids: OrderedDict[str, Any] = OrderedDict()
        self._capacity = capacity

    def add(self, key: str) -> bool:
        """Remember `key`; False when it was already there (a duplicate)."""
        return self.first(key, True) is None

    def first(self, key: str, value: Any) -> Any:
        """Remember `value` for a new `key` and return None; for a key seen before, the value first remembered."""
        if key in self._ids:
            self._ids.move_to_end(key)
            return self._ids[key]
        self._ids[key] = value
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        return None

    def __contains__(self, key: str) -> bool:
        return key in self._ids
