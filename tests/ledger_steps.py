"""The ledger's writes as the guard makes them, for tests that record a step or flag a turn without the guard."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from roundtrip._guard.ledger import PENDING, ApprovalRow, Ledger


async def advance(
    ledger: Ledger,
    turn: Any,
    step: int,
    usage: dict[str, int],
    cost_usd: float,
    pending: str,
    outcome: str | None = None,
    then: Callable[[Any], Any] | None = None,
    *,
    now: float,
) -> bool:
    """Record step `step` as the loop does; no trace context, and nothing run in its transaction unless `then`."""
    return await ledger.advance(
        turn, step, usage, cost_usd, pending, outcome=outcome, traceparent=None, then=then, now=now
    )


async def flag_stuck(
    ledger: Ledger, turn_id: str, now: float, stuck_after_s: float = 0.0, step: int | None = None
) -> bool:
    """Flag the turn as the sweeper does: idle `stuck_after_s` by `now`, at step `step` if given."""
    return await ledger.flag_stuck(turn_id, now, stuck_after_s, step)


async def approvals_of(ledger: Ledger, status: str | None = PENDING, turn_id: str | None = None) -> list[ApprovalRow]:
    """The approvals the console lists (a page of 50, newest first): pending ones unless `status` says otherwise."""
    return await ledger.list_approvals(status, turn_id, limit=50)
