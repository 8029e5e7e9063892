"""A message as the Messages API streams it (`"stream": true`): server-sent events in the API's order.

The message is the one a plain request gets, so a stream and a plain call of the same request answer the same; its
deltas are paced so that a streamed answer is complete when a plain one arrives. `529-midstream` stops the stream
after its first text delta with the API's overloaded_error event. The events: docs/decisions/simulator.md.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

FIRST_EVENT_SHARE = 0.3  # of the latency, before message_start: the time to the first token
WORDS_PER_DELTA = 2  # a text delta carries about this many words (the API's are a token or a few)
JSON_PIECES = 3  # a tool_use input arrives in this many input_json_delta pieces
MIDSTREAM_FAULT = "529-midstream"


def _pieces(text: str) -> list[str]:
    tokens = re.findall(r"\s*\S+", text) or ([text] if text else [])
    pieces = ["".join(tokens[i : i + WORDS_PER_DELTA]) for i in range(0, len(tokens), WORDS_PER_DELTA)]
    if pieces and (tail := text[len("".join(tokens)) :]):
        pieces[-1] += tail  # trailing whitespace stays: the concatenation is the text exactly
    return pieces


def _json_pieces(value: Any) -> list[str]:
    raw = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    size = max(1, -(-len(raw) // JSON_PIECES))
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def _block_events(index: int, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    if block.get("type") == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in _pieces(block.get("text", ""))]
    elif block.get("type") == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in _json_pieces(block.get("input"))]
    else:  # a block the fleet's personas never write: whole at its start
        start, deltas = block, []
    return [
        ("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}),
        *(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas),
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of `message` streamed, in the API's order."""
    usage = message["usage"]
    started = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},
    }
    out: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": started})]
    for index, block in enumerate(message["content"]):
        block_events = _block_events(index, block)
        if index == 0:  # the API pings once, after the first block starts
            block_events.insert(1, ("ping", {"type": "ping"}))
        out += block_events
    out += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
                "usage": usage,  # cumulative, as the API sends it
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return out


def _frame(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def _overloaded(request_id: str) -> dict[str, Any]:
    error = {"type": "overloaded_error", "message": "Overloaded (simulated fault, mid-stream)."}
    return {"type": "error", "error": error, "request_id": request_id}


async def body(
    message: dict[str, Any],
    latency_s: float,
    fault: str = "",
    request_id: str = "",
    frame: Callable[[str, dict[str, Any]], bytes] | None = None,
) -> AsyncIterator[bytes]:
    """The response body: each event framed as SSE (or by `frame`), paced over `latency_s`."""
    frame = frame or _frame
    pairs = events(message)
    deltas = sum(1 for event, _ in pairs if event == "content_block_delta")
    clock = asyncio.get_running_loop().time
    due = clock() + latency_s * FIRST_EVENT_SHARE  # each event at its own time: a late wake-up does not add up
    if latency_s > 0:
        await asyncio.sleep(due - clock())
    pause = latency_s * (1 - FIRST_EVENT_SHARE) / max(1, deltas)
    texts = 0
    for event, data in pairs:
        if event == "content_block_delta" and pause > 0:
            due += pause
            await asyncio.sleep(max(0.0, due - clock()))
        yield frame(event, data)
        texts += event == "content_block_delta" and data["delta"]["type"] == "text_delta"
        if fault == MIDSTREAM_FAULT and texts == 1:
            yield frame("error", _overloaded(request_id))
            return
