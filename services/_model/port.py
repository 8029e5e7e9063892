"""The one interface the model service calls a model through: the SDK-backed client and roundtrip.testing's models.

A model implements `answer` and `stream_answer` as pydantic-ai's models implement `request` and `request_stream`:
the transcript, then one value with what this call asks besides it (`CallOptions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anthropic

if TYPE_CHECKING:
    from roundtrip._model.streamed import Chunks


@dataclass(frozen=True)
class CallOptions:
    """One call's options: the simulator's persona, the turn's parallel tool use (None: the fleet's setting) and the
    retries before this attempt (None: the SDK counts its own)."""

    persona: str | None
    disable_parallel_tool_use: bool | None
    attempt: int | None


class Model(Protocol):
    """A model's answer to a transcript, with its HTTP headers (none from a model that has none)."""

    @property
    def model(self) -> str: ...

    async def answer(
        self, messages: list[dict[str, Any]], options: CallOptions
    ) -> tuple[anthropic.types.Message, Mapping[str, str]]: ...

    async def stream_answer(
        self, messages: list[dict[str, Any]], options: CallOptions, chunks: Chunks
    ) -> tuple[anthropic.types.Message, Mapping[str, str]]:
        """`answer`, its text given to `chunks` as it comes."""
        ...
