"""A submission whose batch id was never recorded (a crash or a timeout after `create`): the API takes no idempotency
key, so the results of the batches created around it that hold no recorded call say where its calls went.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from roundtrip._model.batch_api import BatchApi

log = logging.getLogger("roundtrip.model")
LISTED_BEFORE_S = 60.0  # the API's clock may read a little behind ours: a batch listed as created before we took it
CREATED_WITHIN_S = 600.0  # `create` is sent right after the calls are taken and times out well within this
SETTLE_AFTER_S = 120.0  # a create the client gave up on may still land: settled no sooner than this after it was sent


class SettledCalls(Protocol):
    async def submitting(self, submission: str) -> list[Any]: ...

    async def known(self, batch_ids: list[str]) -> set[str]: ...

    async def adopt(self, submission: str, custom_ids: list[str], batch_id: str) -> None: ...

    async def requeue(self, submission: str) -> None: ...


@dataclass(frozen=True)
class Takeover:
    api: BatchApi
    calls: Callable[[], SettledCalls]

    async def resolve(self, submission: str, taken_at: float) -> list[str] | None:
        """The batches its calls were found in (taken over), the rest queued again; None while a candidate is open."""
        waiting = {row.custom_id for row in await self.calls().submitting(submission)}
        if not waiting:
            return []
        listed = [
            batch
            for batch in await self.api.created_since(taken_at - LISTED_BEFORE_S)
            if batch.created_at <= taken_at + CREATED_WITHIN_S
        ]
        known = await self.calls().known([batch.id for batch in listed])
        candidates = [batch for batch in listed if batch.id not in known]
        if any(not batch.ended for batch in candidates):
            return None
        adopted = []
        for batch in candidates:
            found = [result.custom_id async for result in self.api.results(batch.id) if result.custom_id in waiting]
            if found:
                log.warning(
                    "submission %s: %d calls found in batch %s, whose id was never recorded: taken over",
                    submission,
                    len(found),
                    batch.id,
                )
                await self.calls().adopt(submission, found, batch.id)
                waiting -= set(found)
                adopted.append(batch.id)
        if waiting:
            log.warning("submission %s: %d calls in no batch: queued again", submission, len(waiting))
            await self.calls().requeue(submission)
        return adopted
