"""What a person's word is, the same from the console and from `roundtrip approvals approve|deny`: whether an approval
can still be decided, and the signed ApprovalDecided that carries the decision to the guard.

The decision key signs here, in the process that holds it: it never leaves it. A decision refused here is never sent;
one sent that then finds the turn moved on is refused by the guard too, so nothing is ever applied twice.
"""

from __future__ import annotations

import time

from roundtrip._kernel.settings import ApprovalSettings
from roundtrip._kernel.storage.ledger_reads import PENDING, ApprovalRow, TurnRow
from roundtrip._kernel.storage.turnstore import AWAITING, ENDED
from roundtrip._kernel.wire.approvals import Signer
from roundtrip._kernel.wire.events import ApprovalDecided, CancelTurn, Decision


class Refused(Exception):
    """A word that must not be sent; `status`: the console's HTTP answer (404 unknown, 409 too late)."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.message, self.status = message, status


def refusal(
    approval_id: str, row: ApprovalRow | None, turn: TurnRow | None, now: float | None = None
) -> Refused | None:
    """Why approval `approval_id` (its ledger row and its turn's) can no longer be decided; None when it can."""
    if row is None:
        return Refused(f"no approval {approval_id}", 404)
    if row.status != PENDING or turn is None or turn.status != AWAITING:
        return Refused(
            f"approval {approval_id} is {row.status}"
            + (f" by {row.decided_by}" if row.decided_by else "")
            + (f"; its turn is {turn.status}" + (f" ({turn.outcome})" if turn.outcome else "") if turn else "")
            + ": nothing sent"
        )
    now = time.time() if now is None else now
    if now >= row.expires_at:
        return Refused(f"approval {approval_id} passed its deadline {now - row.expires_at:.0f} s ago: nothing sent")
    return None


def decision_signer(settings: ApprovalSettings) -> Signer:
    """The private key people's decisions are signed with (ROUNDTRIP_DECISION_SIGNING_KEY), in this process only."""
    return Signer.of(settings.decision_signing_key.get_secret_value(), "ROUNDTRIP_DECISION_SIGNING_KEY")


def signed_decision(row: ApprovalRow, approve: bool, reason: str, decided_by: str, signer: Signer) -> ApprovalDecided:
    """The decision on the very call the approval names (turn, tool_use id, input digest), signed by `signer`."""
    return signer.sign(
        ApprovalDecided(
            approval_id=row.approval_id,
            turn_id=row.turn_id,
            tool_use_id=row.tool_use_id,
            input_sha256=row.input_sha256,
            decision=Decision.APPROVE if approve else Decision.DENY,
            reason=reason,
            decided_by=decided_by,
            decided_at=round(time.time(), 3),
        )
    )


def cancel_refusal(turn_id: str, turn: TurnRow | None) -> Refused | None:
    """Why turn `turn_id` cannot be cancelled (unknown, or ended already); None when it can."""
    if turn is None:
        return Refused(f"no turn {turn_id}", 404)
    if turn.status == ENDED:
        return Refused(f"turn {turn_id} already ended ({turn.outcome}): nothing sent")
    return None


def cancel_command(turn: TurnRow, reason: str, requested_by: str) -> CancelTurn:
    """The guard checks the turn's customer and conversation against the ledger's."""
    return CancelTurn(
        turn_id=turn.turn_id,
        customer_id=turn.customer_id,
        conversation_id=turn.conversation_id,
        reason=reason,
        requested_by=requested_by,
    )
