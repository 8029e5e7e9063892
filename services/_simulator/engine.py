"""Turn a validated request and a persona name into a Messages API `message` object.

The content is a pure function of (persona, request body): the persona decides, then
the engine keeps only tools the request offers (and honours tool_choice), assigns ids
from a hash of the request, applies stop_sequences and max_tokens, and adds usage.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .personas import PERSONAS, Reply
from .transcript import Transcript
from .usage import PromptCache, output_tokens

NO_TOOLS_TEXT = (
    "I'm sorry, I don't have access to the systems I'd need to help with that right now. "
    "Please try again later, or ask to be connected with a member of our support team."
)


def request_digest(persona: str, body: dict[str, Any]) -> str:
    canonical = json.dumps([persona, body], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def respond(body: dict[str, Any], persona: str, cache: PromptCache, scripted: Reply | None = None) -> dict[str, Any]:
    """The message the persona (or the scripted reply, when given) answers this request with."""
    transcript = Transcript.from_request(body)
    reply = scripted or PERSONAS[persona](transcript)
    content = _offered_tools_only(reply.content, body)
    digest = request_digest(persona, {k: v for k, v in body.items() if k != "stream"})  # streamed or not: the same
    content = _with_ids(content, digest)
    stop_reason, stop_sequence = reply.stop_reason, reply.stop_sequence
    if stop_reason is None:
        content, stop_sequence = _cut_at_stop_sequence(content, transcript.stop_sequences)
        if stop_sequence is not None:
            stop_reason = "stop_sequence"
        else:
            stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    content, produced, truncated = _within_max_tokens(content, body["max_tokens"])
    if truncated:
        stop_reason, stop_sequence = "max_tokens", None
    return {
        "id": f"msg_{digest[:24]}",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {**cache.input_usage(body), "output_tokens": produced},
    }


def _offered_tools_only(content: list[dict[str, Any]], body: dict[str, Any]) -> list[dict[str, Any]]:
    offered = {t["name"] for t in body.get("tools") or []}
    choice = body.get("tool_choice") or {}
    if choice.get("type") == "none":
        offered = set()
    kept = [b for b in content if b["type"] != "tool_use" or b["name"] in offered]
    if choice.get("disable_parallel_tool_use"):
        uses = [i for i, b in enumerate(kept) if b["type"] == "tool_use"]
        kept = [b for i, b in enumerate(kept) if i not in uses[1:]]
    wanted_tools = any(b["type"] == "tool_use" for b in content)
    if wanted_tools and not any(b["type"] == "tool_use" for b in kept):
        return [{"type": "text", "text": NO_TOOLS_TEXT}]
    return kept


def _with_ids(content: list[dict[str, Any]], digest: str) -> list[dict[str, Any]]:
    out = []
    for index, block in enumerate(content):
        if block["type"] == "tool_use":
            tool_id = hashlib.sha256(f"{digest}:{index}".encode()).hexdigest()[:24]
            block = {"type": "tool_use", "id": f"toolu_{tool_id}", "name": block["name"], "input": block["input"]}
        out.append(block)
    return out


def _cut_at_stop_sequence(
    content: list[dict[str, Any]], stop_sequences: tuple[str, ...]
) -> tuple[list[dict[str, Any]], str | None]:
    """Generation stops where a text first contains one of the stop sequences."""
    if not stop_sequences:
        return content, None
    for index, block in enumerate(content):
        if block["type"] != "text":
            continue
        hits = [(block["text"].find(s), s) for s in stop_sequences if s in block["text"]]
        if hits:
            position, sequence = min(hits)
            head = block["text"][:position]
            return content[:index] + ([{"type": "text", "text": head}] if head else []), sequence
    return content, None


def _within_max_tokens(content: list[dict[str, Any]], max_tokens: int) -> tuple[list[dict[str, Any]], int, bool]:
    """Keep what fits in max_tokens: a text is cut, a tool_use that does not fit is dropped."""
    kept: list[dict[str, Any]] = []
    used = 0
    for block in content:
        cost = output_tokens(block)
        if used + cost <= max_tokens:
            kept.append(block)
            used += cost
            continue
        room = max_tokens - used
        if block["type"] == "text" and room > 0:
            kept.append({"type": "text", "text": block["text"][: room * 4]})
        return kept, max_tokens, True
    return kept, max(used, 1), False


__all__ = ["Reply", "request_digest", "respond"]
