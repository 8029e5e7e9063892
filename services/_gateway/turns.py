"""Gateway: a support request starts a turn; an ended turn becomes its one reply."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from roundtrip._kernel.storage.turnstore import ENDED, NO_SUCH_TURN, disagreement, reply_digest
from roundtrip._kernel.wire.events import StartTurn, SupportReply, SupportRequest, Turn, TurnEnded

TURN_NAMESPACE = uuid.UUID("6f1c2b8e-3a4d-4e0f-9b7a-52c1d0e8a901")


def turn_id_for(request: SupportRequest) -> str:
    """Deterministic, so a redelivered request maps to the same turn: a request id is unique within its conversation."""
    return "turn_" + uuid.uuid5(TURN_NAMESPACE, f"{request.conversation_id}\x00{request.request_id}").hex[:24]


def start_turn(request: SupportRequest, trace_id: str, span_id: str = "", started_at: float = 0.0) -> StartTurn:
    """The turn a request starts; `trace_id`/`span_id`: its turn span, the root of its trace."""
    turn = Turn(
        turn_id=turn_id_for(request),
        request_id=request.request_id,
        conversation_id=request.conversation_id,
        customer_id=request.customer_id,
        persona=request.persona,
        trace_id=trace_id,
        span_id=span_id,
        started_at=started_at,
        disable_parallel_tool_use=request.disable_parallel_tool_use,
        stream=request.stream,
        metadata=request.metadata,
    )
    return StartTurn(turn=turn, text=request.text)


def reply_for(ended: TurnEnded) -> SupportReply:
    turn = ended.turn
    return SupportReply(
        **turn.addressed(),
        text=ended.text,
        outcome=ended.outcome,
        steps=ended.step,
        usage=ended.spent,
        cost_usd=ended.cost_usd,
        metadata=turn.metadata,
    )


def forged(ended: TurnEnded, recorded: Any, now: float, undigested_s: float) -> str | None:
    """Why `ended` is not the end the guard recorded (`TurnStore.ended_as`); None when it is, word for word.
    An end a guard recorded before replies were digested (ledger_0006) is answered only within `undigested_s` of
    it, so the ends in flight at an upgrade still reach their customers and no older one can be replayed."""
    if recorded is None:
        return NO_SUCH_TURN
    if recorded.status != ENDED:
        return "the ledger has not ended this turn"
    if (why := disagreement(ended.turn, recorded)) is not None:
        return why
    if recorded.request_id != ended.turn.request_id:
        return "its request is not the one the turn was started for"
    if recorded.outcome != ended.outcome.value:
        return "its outcome is not the one the ledger recorded"
    if recorded.reply_sha256 is None:
        if recorded.ended_at is None or now - recorded.ended_at > undigested_s:
            return "its turn ended before replies were recorded, too long ago to answer"
    elif recorded.reply_sha256 != reply_digest(ended.text):
        return "its text is not the reply the guard recorded"
    return None


def in_lane(command: StartTurn, lane: Literal["interactive", "batch"], batch_deadline_s: float) -> StartTurn:
    """`command`'s turn in `lane`; a batch turn's deadline counted from the request's arrival (the guard sets an
    interactive turn's)."""
    if lane == "interactive":
        return command
    turn = command.turn
    deadline_at = round(turn.started_at + batch_deadline_s, 3)
    return command.model_copy(update={"turn": turn.model_copy(update={"lane": lane, "deadline_at": deadline_at})})
