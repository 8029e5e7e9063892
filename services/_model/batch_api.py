"""The Message Batches API as the batch lane uses it: create, is it ended, its results, the batches created since a
moment, cancel; `SdkBatches` is the anthropic SDK's `messages.batches` (the Anthropic API, or the simulator without a
key)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Listed:
    """A batch as the list shows it: its id, when it was created (Unix time), whether it has ended."""

    id: str
    created_at: float
    ended: bool


@dataclass(frozen=True)
class Result:
    """One request's result: `kind` is the API's result type (succeeded: its message; errored: `error` says why)."""

    custom_id: str
    kind: str
    message: Any
    error: str


class BatchApi(Protocol):
    async def create(self, requests: list[dict[str, Any]], headers: dict[str, str]) -> str: ...

    async def ended(self, batch_id: str) -> bool: ...

    def results(self, batch_id: str) -> AsyncIterator[Result]:
        """The results of an ended batch, in any order."""
        ...

    async def created_since(self, since: float) -> list[Listed]: ...

    async def cancel(self, batch_id: str) -> None: ...


class SdkBatches:
    def __init__(self, batches: Any) -> None:
        """`batches`: the SDK client's `messages.batches` resource."""
        self._batches = batches

    async def create(self, requests: list[dict[str, Any]], headers: dict[str, str]) -> str:
        batch = await self._batches.create(requests=requests, extra_headers=headers)
        return str(batch.id)

    async def ended(self, batch_id: str) -> bool:
        return bool((await self._batches.retrieve(batch_id)).processing_status == "ended")

    async def results(self, batch_id: str) -> AsyncIterator[Result]:
        async for each in await self._batches.results(batch_id):
            result = each.result
            error = getattr(getattr(result, "error", None), "error", None)
            yield Result(
                custom_id=each.custom_id,
                kind=result.type,
                message=getattr(result, "message", None),
                error=f"{error.type}: {error.message}" if error is not None else "",
            )

    async def created_since(self, since: float) -> list[Listed]:
        found = []
        async for batch in self._batches.list(limit=100):
            created = batch.created_at.timestamp()
            if created < since:
                break
            found.append(Listed(batch.id, created, batch.processing_status == "ended"))
        return found

    async def cancel(self, batch_id: str) -> None:
        await self._batches.cancel(batch_id)
