"""The one interface the model service calls a model through: the SDK-backed client and roundtrip.testing's models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import anthropic

if TYPE_CHECKING:
    from roundtrip._model.streamed import Chunks


class Model(Protocol):
    """A model's answer to a transcript, with its HTTP headers (none from a model that has none)."""

    @property
    def model(self) -> str: ...

    async def answer(
        self,
        messages: list[dict[str, Any]],
        persona: str | None,
        disable_parallel_tool_use: bool | None = None,
        attempt: int | None = None,
    ) -> tuple[anthropic.types.Message, Mapping[str, str]]: ...

    async def stream_answer(
        self,
        messages: list[dict[str, Any]],
        persona: str | None,
        disable_parallel_tool_use: bool | None = None,
        attempt: int | None = None,
        chunks: Chunks | None = None,
    ) -> tuple[anthropic.types.Message, Mapping[str, str]]:
        """`answer`, its text given to `chunks` as it comes."""
        ...
