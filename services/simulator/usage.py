"""Token accounting like the real API, with a crude estimate: ceil(len(JSON text) / 4).

Prompt caching: the prompt is read in the API's order (tools, system, messages). The prefix
up to and including the last block marked `cache_control` (or everything, when the request
sets a top-level `cache_control`) is cached. The first time a prefix is seen it is billed
as `cache_creation_input_tokens`, while it lives (5 minutes, or 1 hour for `ttl: "1h"`,
refreshed on every hit) as `cache_read_input_tokens`; `input_tokens` counts only the rest.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from typing import Any


def estimate_tokens(value: Any) -> int:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return math.ceil(len(text) / 4)


def prompt_of(body: dict) -> dict:
    """The part of a request that is billed as input."""
    return {key: body[key] for key in ("tools", "system", "messages") if body.get(key) is not None}


def output_tokens(block: dict) -> int:
    if block["type"] == "text":
        return estimate_tokens(block["text"])
    if block["type"] == "tool_use":
        return estimate_tokens({"name": block["name"], "input": block["input"]})
    return estimate_tokens(block)


def _prompt_items(body: dict) -> list[Any]:
    items: list[Any] = list(body.get("tools") or [])
    system = body.get("system")
    if isinstance(system, str):
        items.append(system)
    elif isinstance(system, list):
        items.extend(system)
    for message in body["messages"]:
        content = message["content"]
        items.extend(content if isinstance(content, list) else [content])
    return items


class PromptCache:
    """In-process memory of cached prefixes (hash -> expiry time)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_entries: int = 100_000):
        self._clock = clock
        self._expiry: dict[str, float] = {}
        self._max_entries = max_entries

    def input_usage(self, body: dict) -> dict[str, Any]:
        """input_tokens, cache_creation_input_tokens, cache_read_input_tokens (+ TTL breakdown)."""
        total = estimate_tokens(prompt_of(body))
        items = _prompt_items(body)
        marked = [i for i, item in enumerate(items) if isinstance(item, dict) and item.get("cache_control")]
        if body.get("cache_control"):
            breakpoint_, control = len(items) - 1, body["cache_control"]
        elif marked:
            breakpoint_, control = marked[-1], items[marked[-1]]["cache_control"]
        else:
            return _usage(total, 0, 0, "5m")
        ttl = "1h" if isinstance(control, dict) and control.get("ttl") == "1h" else "5m"
        prefix = items[: breakpoint_ + 1]
        prefix_tokens = min(total, estimate_tokens(prefix))
        key = hashlib.sha256(json.dumps([body["model"], prefix], sort_keys=True).encode()).hexdigest()
        now = self._clock()
        hit = self._expiry.get(key, 0.0) > now
        if len(self._expiry) >= self._max_entries:
            self._expiry = {k: v for k, v in self._expiry.items() if v > now}
        self._expiry[key] = now + (3600.0 if ttl == "1h" else 300.0)
        rest = total - prefix_tokens
        if hit:
            return _usage(rest, 0, prefix_tokens, ttl)
        return _usage(rest, prefix_tokens, 0, ttl)


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
