"""A bounded memory of ids already handled: the cheap first line against redelivery."""

from __future__ import annotations

from collections import OrderedDict


class SeenIds:
    def __init__(self, capacity: int = 100_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def add(self, key: str) -> bool:
        """Remember `key`; False when it was already there (a duplicate)."""
        if key in self._ids:
            self._ids.move_to_end(key)
            return False
        self._ids[key] = None
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        return True

    def __contains__(self, key: str) -> bool:
        return key in self._ids
