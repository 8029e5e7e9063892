"""A model call streamed: the API's events read as they come, the text published in chunks, the message put together.

The events add up to the same message a plain call returns, so the guard, the fence, the budgets and the limiter see
a streamed call as a plain one. A tool's input is parsed once, when its block stops (the SDK's helper re-parses the
growing JSON at every piece and refuses deeply nested inputs). Text goes out per ROUNDTRIP_STREAM_CHUNK_MS or _CHARS,
so a token is not a Kafka message. Each attempt is its own stream; an attempt that fails after some text is cut, and a
possibly redelivered call first cuts every earlier stream of its step (the process that had it may have died).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic

from roundtrip._kernel.wire.events import StreamedText, Turn

log = logging.getLogger("roundtrip.model")

Send = Callable[[StreamedText, str], Awaitable[None]]  # (chunk, conversation id): the outlet to support.stream


class Chunks:
    """The text of one step's call, to support.stream: batched by time and size, numbered per stream, in order."""

    def __init__(self, turn: Turn, step: int, send: Send, chunk_s: float, chunk_chars: int) -> None:
        self.turn, self.step, self.send = turn, step, send
        self.chunk_s, self.chunk_chars = chunk_s, chunk_chars
        self.stream_id, self.sequence, self.open = "", 0, False  # open: published text, not ended
        self._buffer: list[str] = []
        self._size, self._since = 0, 0.0
        self._sending: list[asyncio.Task[None]] = []
        self.published = 0
        self._cut_earlier = False

    def _chunk(self, stream_id: str, sequence: int, **fields: Any) -> StreamedText:
        return StreamedText(**self.turn.addressed(), step=self.step, stream_id=stream_id, sequence=sequence, **fields)

    def _publish(self, chunk: StreamedText) -> None:
        """Send it without waiting for earlier chunks' acknowledgements: each task hands its record to the producer at
        its first step, and the tasks start in order, so a conversation's chunks reach their partition in order."""
        self.published += 1
        self._sending.append(asyncio.ensure_future(self.send(chunk, self.turn.conversation_id)))

    async def sent(self) -> None:
        """Wait until every chunk so far is acknowledged (the command's offset is committed only after that)."""
        sending, self._sending = self._sending, []
        for result in await asyncio.gather(*sending, return_exceptions=True):
            if isinstance(result, Exception):  # the streamed text is a courtesy: the iteration goes out anyway
                log.warning("turn %s step %d: streamed text not published: %s", self.turn.turn_id, self.step, result)

    def cut_earlier(self) -> None:
        """Every earlier stream of this step is cut (a redelivered call: the process that streamed it may be gone);
        sent with the first stream, which begins only once the claim succeeded: nothing goes out for a refused one."""
        self._cut_earlier = True

    def begin(self) -> None:
        if self._cut_earlier:
            self._cut_earlier = False
            self._publish(self._chunk("", 0, cut=True))
        self.cut()
        self.stream_id, self.sequence, self._since = uuid.uuid4().hex[:16], 0, time.monotonic()

    def text(self, piece: str) -> None:
        self._buffer.append(piece)
        self._size += len(piece)
        if self._size >= self.chunk_chars or time.monotonic() - self._since >= self.chunk_s:
            self.flush()

    def flush(self, **fields: Any) -> None:
        if not self._buffer and not fields:
            return
        text, self._buffer, self._size = "".join(self._buffer), [], 0
        self._publish(self._chunk(self.stream_id, self.sequence, text=text, **fields))
        self.sequence, self._since, self.open = self.sequence + 1, time.monotonic(), not fields.get("final")

    def end(self, stop_reason: str | None) -> None:
        self.flush(final=True, tool_use=stop_reason == "tool_use")

    def cut(self) -> None:
        """The current stream failed or is not the step's: discard it (only if it showed anything)."""
        self._buffer, self._size = [], 0
        if self.open:
            self._publish(self._chunk(self.stream_id, self.sequence, cut=True))
            self.sequence, self.open = self.sequence + 1, False


def _block(start: Any) -> dict[str, Any]:
    block = start.model_dump(mode="json", exclude_none=True) if hasattr(start, "model_dump") else dict(start)
    if block.get("type") == "tool_use":
        block["input"] = {}
    return block


async def read(events: Any, chunks: Chunks) -> anthropic.types.Message:
    """The message a stream of the API's events adds up to; its text to `chunks` as it comes."""
    message: dict[str, Any] = {}
    blocks: list[dict[str, Any]] = []
    json_parts: dict[int, list[str]] = {}
    async for event in events:
        kind = event.type
        if kind == "message_start":
            message = event.message.model_dump(mode="json", exclude_none=True)
        elif kind == "content_block_start":
            chunks.flush()  # the text before this block goes now; a last block's text goes with the final chunk
            blocks.append(_block(event.content_block))
        elif kind == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta":
                blocks[event.index]["text"] = blocks[event.index].get("text", "") + delta.text
                chunks.text(delta.text)
            elif delta.type == "input_json_delta":
                json_parts.setdefault(event.index, []).append(delta.partial_json)
        elif kind == "content_block_stop":
            if event.index in json_parts:
                raw = "".join(json_parts.pop(event.index))
                blocks[event.index]["input"] = json.loads(raw) if raw else {}
        elif kind == "message_delta":
            message["stop_reason"], message["stop_sequence"] = event.delta.stop_reason, event.delta.stop_sequence
            usage = event.usage.model_dump(mode="json", exclude_none=True)
            message["usage"] = {**message.get("usage", {}), **usage}  # cumulative: it overwrites message_start's
    message["content"] = blocks
    return anthropic.types.Message.model_validate(message)
