"""The size policy that keeps every event under the broker's message limit, whatever the model or a tool returns.

A tool input over `max_block_bytes` or deeper than `max_input_depth` is not carried (the call becomes an `is_error`
tool_result); a tool result or text over `max_block_bytes` is cut; a transcript over `max_transcript_bytes` has its
largest blocks (oldest first among equals) replaced by markers until it fits. Everything here is iterative (no
recursion), so no input depth can crash it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import StringConstraints

METADATA_MAX_KEYS = 32
METADATA_MAX_KEY_CHARS = 64
METADATA_MAX_BYTES = 4096  # of its compact JSON


MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=METADATA_MAX_KEY_CHARS)]


def bounded_metadata(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A request's metadata as given, if its JSON stays within METADATA_MAX_BYTES (the schema checks its keys)."""
    if value is None:
        return None
    if (size := len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())) > METADATA_MAX_BYTES:
        raise ValueError(f"at most {METADATA_MAX_BYTES} bytes of JSON, got {size}")
    return value


OMITTED_KEY = "roundtrip_omitted"


def too_deep(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return False


def json_size(value: Any) -> int:
    """Bytes of the compact UTF-8 JSON of `value` (only for values already known not to be too deep)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode())


def input_problem(value: Any, max_bytes: int, max_depth: int) -> str | None:
    """Why a tool input cannot be carried ("input too large: N bytes, limit M"), or None."""
    if too_deep(value, max_depth):
        return f"input nested too deep: more than {max_depth} levels, limit {max_depth}"
    size = json_size(value)
    if size > max_bytes:
        return f"input too large: {size} bytes, limit {max_bytes}"
    return None


def omitted(problem: str) -> dict[str, str]:
    return {OMITTED_KEY: f"{problem}; the input was not kept"}


def cap_text(text: str, max_bytes: int, what: str = "text") -> str:
    """`text` cut to about `max_bytes` UTF-8 bytes, with a marker saying how much was cut."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    marker = f"\n[{what} truncated by roundtrip: {len(data)} bytes, limit {max_bytes}]"
    head = data[: max(0, max_bytes - len(marker.encode()))].decode("utf-8", "ignore")
    return head + marker


def _slots(messages: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any], str]]:
    """(size, block, field) of every tool input, tool result and text in the transcript, in order."""
    found = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            found.append((len(content.encode()), message, "content"))
            continue
        for block in content or []:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            field = {"tool_use": "input", "tool_result": "content", "text": "text"}.get(str(kind))
            if field and field in block:
                found.append((json_size(block[field]), block, field))
    return found


def fit_transcript(messages: list[dict[str, Any]], max_bytes: int) -> tuple[list[dict[str, Any]], int]:
    """`messages` (a copy, when changed) under `max_bytes` of JSON; (messages, blocks replaced)."""
    size = json_size(messages)
    if size <= max_bytes:
        return messages, 0
    messages = json.loads(json.dumps(messages))  # never change the caller's copy
    slots = sorted(enumerate(_slots(messages)), key=lambda item: (-item[1][0], item[0]))
    replaced = 0
    for _, (block_size, block, field) in slots:
        if size <= max_bytes:
            break
        note = f"[removed by roundtrip: {block_size} bytes, to keep the turn under the message size limit]"
        replacement: Any = {OMITTED_KEY: note} if field == "input" else note
        size -= block_size - json_size(replacement)
        block[field] = replacement
        replaced += 1
    return messages, replaced
