"""What the console reads: the turn ledger (read only), opened when first needed and again after a failure, so the
console starts and answers while the database is away (its pages say so) and recovers by itself."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from roundtrip._kernel.database import shown
from roundtrip._kernel.storage.ledger_reads import PENDING, ApprovalRow, ConversationReads, TurnReads, TurnRow
from roundtrip._kernel.storage.turnstore import AWAITING, STUCK
from roundtrip._kernel.storage.versions import VersionRow, named

log = logging.getLogger("roundtrip.console")
T = TypeVar("T")
READ_TIMEOUT_S = 5.0
WAITING_SHOWN = 100  # approvals the console's page lists


class LedgerAway(Exception):
    """The ledger could not be read: `str(exc)` says why, in one line (shown on the page)."""


class Books:
    def __init__(self, url: str, conversations_url: str | None) -> None:
        self.url, self.conversations_url = url, conversations_url or url
        self._ledger: TurnReads | None = None
        self._conversations: ConversationReads | None = None
        self._opening = asyncio.Lock()
        self.last_error: str | None = None

    async def _open(self) -> TurnReads:
        async with self._opening:
            if self._ledger is None:
                self._ledger = await TurnReads.open(self.url, read_only=True)
            return self._ledger

    async def _read(self, work: Callable[[TurnReads], Awaitable[T]]) -> T:
        try:
            result = await asyncio.wait_for(work(await self._open()), READ_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - any failure of the database is said on the page, never a crash
            reason = f"the turn ledger ({shown(self.url)}) cannot be read: {type(exc).__name__}: {exc}"[:400]
            if reason != self.last_error:
                log.warning("%s", reason)
            self.last_error = reason
            ledger, self._ledger = self._ledger, None
            if ledger is not None:
                await _quietly(ledger.close())
            raise LedgerAway(reason) from None
        self.last_error = None
        return result

    async def close(self) -> None:
        if self._ledger is not None:
            await self._ledger.close()
            self._ledger = None
        if self._conversations is not None:
            await self._conversations.close()
            self._conversations = None

    async def transcript(self, turn_id: str) -> list[dict[str, Any]] | None:
        """The turn's messages as the conversation store keeps an ended turn; None when it keeps none or is away."""
        try:
            if self._conversations is None:
                self._conversations = await ConversationReads.open(self.conversations_url, read_only=True)
            return await asyncio.wait_for(self._conversations.exchange(turn_id), READ_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the steps are a convenience of the page, never its failure
            log.warning("the conversation store cannot be read: %s: %s", type(exc).__name__, exc)
            store, self._conversations = self._conversations, None
            if store is not None:
                await _quietly(store.close())
            return None

    async def waiting(self) -> list[ApprovalRow]:
        """The approvals waiting for a person (their turn still awaits them), oldest deadline first."""
        rows = await self._read(lambda ledger: ledger.list_approvals(status=PENDING, limit=WAITING_SHOWN))
        return sorted(rows, key=lambda r: r.expires_at)

    async def approval(self, approval_id: str) -> tuple[ApprovalRow | None, TurnRow | None]:
        async def both(ledger: TurnReads) -> tuple[ApprovalRow | None, TurnRow | None]:
            row = await ledger.approval(approval_id)
            return row, (await ledger.get(row.turn_id) if row else None)

        return await self._read(both)

    async def turn(self, turn_id: str) -> tuple[TurnRow | None, list[ApprovalRow]]:
        async def both(ledger: TurnReads) -> tuple[TurnRow | None, list[ApprovalRow]]:
            row = await ledger.get(turn_id)
            if row is None:
                return None, []
            await ledger.with_batches([row])
            return row, await ledger.list_approvals(status=None, turn_id=turn_id, limit=100)

        return await self._read(both)

    async def turns(
        self,
        status: str | None,
        outcome: str | None,
        customer: str | None,
        max_age_s: float | None,
        agent: str | None = None,
        limit: int = 100,
        conversation: str | None = None,
        lane: str | None = None,
        version: str | None = None,
    ) -> list[TurnRow]:
        """Turns filtered by status, outcome, customer, conversation, lane, agent version (`default`: the default one),
        age and agent (a prefix of its digest), in the order people look at them: those that need someone first, then by
        conversation, newest first."""
        since = time.time() - max_age_s if max_age_s else None
        rows = await self._read(
            lambda ledger: ledger.list(
                status=status,
                customer_id=customer,
                limit=limit * 4 if agent else limit,
                conversation_id=conversation,
                outcome=outcome,
                since=since,
                lane=lane,
                version=named(version) if version else None,
            )
        )
        rows = [r for r in rows if (not agent or (r.agent_digest or "").startswith(agent))][:limit]
        return in_reading_order(rows)

    async def versions(self) -> list[VersionRow]:
        """The agent versions side by side, as `roundtrip versions` reads them."""
        return await self._read(lambda ledger: ledger.versions())


NEEDS_SOMEONE = (STUCK, AWAITING)


def in_reading_order(rows: list[TurnRow]) -> list[TurnRow]:
    newest: dict[str, float] = {}
    for r in rows:
        newest[r.conversation_id] = max(newest.get(r.conversation_id, 0.0), r.started_at)
    return sorted(
        rows,
        key=lambda r: (r.status not in NEEDS_SOMEONE, -newest[r.conversation_id], r.conversation_id, -r.started_at),
    )


async def _quietly(awaitable: Awaitable[Any]) -> None:
    with contextlib.suppress(Exception):  # closing a broken connection may fail too
        await awaitable
