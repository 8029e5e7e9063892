"""Token accounting like the real API, with a crude estimate: ceil(len(JSON text) / 4).

Prompt caching as the Messages API documents it: each `cache_control` block is a breakpoint whose prefix is written
to the cache; a request reads the longest cached prefix at a breakpoint or up to 20 block boundaries before it, and is
billed cache reads, cache writes and plain input accordingly. The rules: docs/decisions/simulator.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from roundtrip._kernel.clock import Clock

LOOKBACK_BLOCKS = 20


def minimum_cacheable_tokens(model: str) -> int:
    model = model.lower()
    if "haiku-4-5" in model or "opus-4-5" in model or "opus-4-6" in model:
        return 4096
    if "haiku" in model:
        return 2048
    return 1024


def estimate_tokens(value: Any) -> int:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return math.ceil(len(text) / 4)


def prompt_of(body: dict[str, Any]) -> dict[str, Any]:
    """The part of a request that is billed as input."""
    return {key: body[key] for key in ("tools", "system", "messages") if body.get(key) is not None}


def output_tokens(block: dict[str, Any]) -> int:
    if block["type"] == "text":
        return estimate_tokens(block["text"])
    if block["type"] == "tool_use":
        return estimate_tokens({"name": block["name"], "input": block["input"]})
    return estimate_tokens(block)


def _prompt_items(body: dict[str, Any]) -> list[Any]:
    items: list[Any] = list(body.get("tools") or [])
    system = body.get("system")
    if isinstance(system, str):
        items.append({"type": "text", "text": system})
    elif isinstance(system, list):
        items.extend(system)
    for message in body["messages"]:
        content = message["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        items.extend({"role": message["role"], **block} if isinstance(block, dict) else block for block in blocks)
    return items


MESSAGE_OVERHEAD_TOKENS = 8  # about len('{"role":"assistant","content":[]},') / 4


def _prefixes(body: dict[str, Any], items: list[Any], total: int) -> tuple[list[str], list[int]]:
    """The running hash and token count of the prompt's prefix at each block boundary (the cache's keys and sizes)."""
    digest = hashlib.sha256(str(body["model"]).encode())
    hashes: list[str] = []
    tokens: list[int] = []
    running = 0
    starts = _message_starts(body)
    for index, item in enumerate(items):
        clean = _without_control(item)
        digest.update(json.dumps(clean, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode())
        hashes.append(digest.copy().hexdigest())
        running += estimate_tokens(
            {k: v for k, v in clean.items() if k != "role"} if isinstance(clean, dict) else clean
        )
        running += MESSAGE_OVERHEAD_TOKENS if index in starts else 0
        tokens.append(min(total, running))
    tokens[-1] = total  # the JSON around the blocks: the whole prompt is the prefix up to its last block
    return hashes, tokens


def _message_starts(body: dict[str, Any]) -> set[int]:
    """Indexes (in _prompt_items) of the first block of each message."""
    index = len(body.get("tools") or []) + (1 if isinstance(body.get("system"), str) else len(body.get("system") or []))
    starts = set()
    for message in body["messages"]:
        starts.add(index)
        index += len(message["content"]) if isinstance(message["content"], list) else 1
    return starts


def _without_control(item: Any) -> Any:
    return {k: v for k, v in item.items() if k != "cache_control"} if isinstance(item, dict) else item


class PromptCache:
    """In-process memory of cached prefixes (hash -> expiry time)."""

    MAX_ENTRIES = 100_000

    def __init__(self, clock: Clock):
        self._clock = clock
        self._expiry: dict[str, tuple[float, int]] = {}

    def input_usage(self, body: dict[str, Any], commit: bool = True) -> dict[str, Any]:
        """input_tokens, cache_creation_input_tokens, cache_read_input_tokens (+ TTL breakdown); commit=False only
        looks: nothing is written to or refreshed in the cache (what a request would be billed before admission)."""
        total = estimate_tokens(prompt_of(body))
        items = _prompt_items(body)
        marked = [i for i, item in enumerate(items) if isinstance(item, dict) and item.get("cache_control")]
        if body.get("cache_control") and items:
            marked = sorted({*marked, len(items) - 1})
        if not marked:
            return _usage(total, 0, 0, "5m")
        controls = {
            i: (
                items[i].get("cache_control")
                if i != len(items) - 1 or not body.get("cache_control")
                else body["cache_control"]
            )
            for i in marked
        }
        hashes, tokens = _prefixes(body, items, total)
        now = self._clock.monotonic()
        minimum = minimum_cacheable_tokens(str(body["model"]))
        read_at = -1  # the last block of the longest cached prefix found
        for point in marked:
            for i in range(point, max(-1, point - LOOKBACK_BLOCKS - 1), -1):
                if i > read_at and self._expiry.get(hashes[i], (0.0, 0))[0] > now:
                    read_at = i
                    break
        written_to = read_at
        ttl = "5m"
        for point in marked:
            control = controls[point]
            point_ttl = "1h" if isinstance(control, dict) and control.get("ttl") == "1h" else "5m"
            if tokens[point] < minimum:
                continue  # too short to cache: no entry, billed as input
            if point > read_at:
                written_to, ttl = point, point_ttl
            if point > read_at and commit:
                self._remember(hashes[point], now + (3600.0 if point_ttl == "1h" else 300.0), tokens[point], now)
        read = 0
        if read_at >= 0:  # a hit reads what was written (its size as billed then) and refreshes the entry
            until, read = self._expiry[hashes[read_at]]
            read = min(read, total)
            if commit:
                self._remember(hashes[read_at], max(until, now + 300.0), read, now)
        written = max(0, tokens[written_to] - read) if written_to > read_at else 0
        return _usage(total - read - written, written, read, ttl)

    def _remember(self, key: str, until: float, tokens: int, now: float) -> None:
        if len(self._expiry) >= self.MAX_ENTRIES:
            self._expiry = {k: v for k, v in self._expiry.items() if v[0] > now}
        self._expiry[key] = (max(until, self._expiry.get(key, (0.0, 0))[0]), tokens)


def _usage(input_tokens: int, creation: int, read: int, ttl: str) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": creation,
        "cache_read_input_tokens": read,
        "cache_creation": {
            "ephemeral_5m_input_tokens": creation if ttl == "5m" else 0,
            "ephemeral_1h_input_tokens": creation if ttl == "1h" else 0,
        },
        "service_tier": "standard",
    }
