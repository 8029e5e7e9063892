"""A ledger that lists approvals, for the CLI's views in unit tests: a pending approval's row as the ledger
returns it, and `TurnReads.open` (the ledger's read port) patched to one that lists those rows."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from roundtrip._kernel.storage.ledger_reads import TurnReads
from roundtrip._kernel.wire.events import ApprovalRequested, CheckedCall, Turn


def pending_approval(turn: Turn, tool: str, tool_input: dict[str, Any], reason: str) -> SimpleNamespace:
    """The ledger's row of one call of `turn` waiting for a person."""
    call = CheckedCall(id="toolu_1", name=tool, input=tool_input, approved=True)
    request = ApprovalRequested(
        approval_id="appr_" + "9" * 24,
        turn=turn,
        step=1,
        call=call,
        reason=reason,
        input_sha256="0" * 64,
        requested_at=time.time(),
        expires_at=time.time() + 900,
        messages=[],
    )
    return SimpleNamespace(
        approval_id=request.approval_id,
        status="pending",
        customer_id=turn.customer_id,
        tool=tool,
        reason=reason,
        decided_by=None,
        decided_at=None,
        requested_at=request.requested_at,
        expires_at=request.expires_at,
        turn_id=turn.turn_id,
        request_json=request.model_dump_json(),
    )


def list_these_approvals(monkeypatch: Any, rows: list[SimpleNamespace]) -> None:
    """Every ledger the CLI opens lists `rows` as its approvals."""

    class Listing:
        async def list_approvals(self, status: str, limit: int) -> list[SimpleNamespace]:
            return rows

        async def close(self) -> None:
            pass

    async def open_ledger(url: str, read_only: bool = False) -> Listing:
        return Listing()

    monkeypatch.setattr(TurnReads, "open", staticmethod(open_ledger))
