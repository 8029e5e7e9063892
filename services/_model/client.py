"""The model's client: the SDK's client of the configured platform; on the Anthropic API without a key, the simulator.

It owns the static prefix of every call (system prompt and tools, marked for prompt caching). With `cache_history`
the transcript is cached too, by two moving breakpoints: the last message (this request writes its prefix) and
messages[-3], the previous request's last (a request adds the response and the next user message), which this one
reads; with tools and system prompt that is the API's limit of 4. The SDK retries nothing (`max_retries=0`), so the
limiter sees every 429. Its transport is aiohttp, not httpx's pool (docs/decisions/http-clients.md).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Protocol

import anthropic

from roundtrip._model import providers, streamed
from roundtrip._model.port import CallOptions
from roundtrip._model.streamed import Chunks

MAX_BREAKPOINTS = 4  # the Messages API refuses a request with more blocks marked cache_control
UNCACHEABLE = {"thinking", "redacted_thinking"}  # blocks cache_control may not be put on


def _marked(message: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of `message` with cache_control on its last cacheable block (None when it has none)."""
    content = message.get("content")
    if isinstance(content, str):
        return (
            {**message, "content": [{"type": "text", "text": content, "cache_control": {"type": "ephemeral"}}]}
            if content
            else None
        )
    blocks = list(content or [])
    for i in range(len(blocks) - 1, -1, -1):
        block = blocks[i]
        if (
            isinstance(block, dict)
            and block.get("type") not in UNCACHEABLE
            and not (block.get("type") == "text" and not block.get("text"))
        ):
            blocks[i] = {**copy.copy(block), "cache_control": {"type": "ephemeral"}}
            return {**message, "content": blocks}
    return None


def with_history_breakpoints(messages: list[dict[str, Any]], available: int) -> list[dict[str, Any]]:
    """`messages` (copied where changed) with at most `available` breakpoints, the last message first."""
    marked = list(messages)
    for index in (len(messages) - 1, len(messages) - 3)[: max(0, available)]:
        if index >= 0 and (copy_ := _marked(messages[index])) is not None:
            marked[index] = copy_
    return marked


class ClientSettings(providers.ModelAccess, Protocol):
    """The settings the client reads besides its provider's: ModelSettings' shape of each call."""

    max_tokens: int
    cache_history: bool
    disable_parallel_tool_use: bool

    @property
    def use_simulator(self) -> bool: ...


class ModelClient:
    def __init__(
        self,
        settings: ClientSettings,
        tools: list[dict[str, Any]],
        system_prompt: str,
        model: str,
        sdk_retries: int,
    ) -> None:
        """`sdk_retries`: 0 in the model service, whose limiter must see every 429; a plain loop takes the SDK's."""
        self._settings = settings
        self._tools = tools
        self._system = [{"type": "text", "text": system_prompt, "cache_control": {"type": "ephemeral"}}]
        self._model = model
        self._provider = providers.of(settings)
        self._client = self._provider.client(
            settings,
            max_retries=sdk_retries,
            http_client=anthropic.DefaultAioHttpClient(timeout=settings.model_timeout_s),
        )
        # the persona header goes only to a simulator (of the Anthropic API, or a platform's at a given endpoint)
        self._persona_header = settings.use_simulator or (
            settings.model_provider != "anthropic" and bool(settings.anthropic_base_url)
        )

    @property
    def model(self) -> str:
        return self._model

    @property
    def static_breakpoints(self) -> int:
        return sum(1 for block in [*self._tools, *self._system] if block.get("cache_control"))

    def prepared(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self._settings.cache_history:
            return messages
        return with_history_breakpoints(messages, MAX_BREAKPOINTS - self.static_breakpoints)

    def tool_choice(self, disable_parallel_tool_use: bool | None) -> dict[str, Any] | None:
        """`tool_choice` of a call: auto without parallel use when that is off; else none (the API's default)."""
        disabled = (
            self._settings.disable_parallel_tool_use if disable_parallel_tool_use is None else disable_parallel_tool_use
        )
        return {"type": "auto", "disable_parallel_tool_use": True} if disabled else None

    async def answer(
        self, messages: list[dict[str, Any]], options: CallOptions
    ) -> tuple[anthropic.types.Message, Mapping[str, str]]:
        """The model's message and the answer's HTTP headers."""
        raw = await self._raw(messages, options, stream=False)
        return await raw.parse(), raw.headers

    async def stream_answer(
        self, messages: list[dict[str, Any]], options: CallOptions, chunks: Chunks
    ) -> tuple[anthropic.types.Message, Mapping[str, str]]:
        """`answer` on the streaming endpoint, its text to `chunks` as it comes; an `error` event raises."""
        raw = await self._raw(messages, options, stream=True)
        events = await raw.parse()
        try:
            return await streamed.read(events, chunks), raw.headers
        finally:
            await events.close()

    def request(self, messages: list[dict[str, Any]], options: CallOptions) -> dict[str, Any]:
        """The Messages API request of a call: a direct call's body, a batch request's params."""
        choice = self.tool_choice(options.disable_parallel_tool_use)
        return {
            "model": self._model,
            "max_tokens": self._settings.max_tokens,
            "system": self._system,
            "tools": self._tools,
            "messages": self.prepared(messages),
            **({"tool_choice": choice} if choice else {}),
        }

    def persona_headers(self, persona: str | None) -> dict[str, str]:
        """The simulator's persona header (a call's, or a whole batch's); none for a real platform."""
        return {"x-roundtrip-persona": persona} if persona and self._persona_header else {}

    @property
    def batches(self) -> Any:
        """The SDK client's Message Batches (`messages.batches`)."""
        return self._client.messages.batches

    async def _raw(self, messages: list[dict[str, Any]], options: CallOptions, stream: bool) -> Any:
        attempt = options.attempt
        headers = {} if attempt is None else {"x-stainless-retry-count": str(attempt)}
        # the wire's JSON dicts, not the SDK's TypedDicts: the same shapes
        return await self._client.messages.with_raw_response.create(
            **self.request(messages, options),
            extra_headers={**headers, **self.persona_headers(options.persona)},
            **({"stream": True} if stream else {}),
        )

    async def aclose(self) -> None:
        await self._client.close()
