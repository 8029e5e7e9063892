"""`roundtrip eval record CONVERSATION`: a conversation the fleet has had, as a case that replays it.

Its turns come from the ledger and its history from the guard's conversation store; each becomes the customer's
message, the model's responses as a script, and expectations of what it did. A turn the guard stopped is kept as its
history has it: its outcome is left for the author to expect.
"""

from __future__ import annotations

from typing import Any

from roundtrip._kernel.settings import Settings

TURNS_READ = 10_000  # a customer's turns read from the ledger to find the conversation's


class NotRecorded(LookupError):
    """The conversation (or a turn of it) is not in the ledger or its history is no longer kept."""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def turn_case(exchange: list[dict[str, Any]], outcome: str | None, steps: int) -> tuple[dict[str, Any], str | None]:
    """One stored turn as a case's turn, and a note when its outcome could not be kept as an expectation."""
    opener = next((m for m in exchange if m["role"] == "user" and _text(m["content"]).strip()), None)
    if opener is None:
        raise NotRecorded("a turn of it has no words of the customer in its history")
    script: list[list[dict[str, Any]]] = []
    tools: list[str] = []
    for message in exchange:
        if message["role"] != "assistant" or not isinstance(message["content"], list):
            continue
        response = []
        for block in message["content"]:
            if block.get("type") == "text" and block.get("text"):
                response.append({"type": "text", "text": block["text"]})
            elif block.get("type") == "tool_use":
                response.append({"type": "tool_use", "name": block["name"], "input": block.get("input", {})})
                tools.append(block["name"])
        if response:
            script.append(response)
    expect: dict[str, Any] = {"tools_called": sorted(set(tools))}
    note = None
    if outcome == "end_turn":
        expect = {"outcome": "end_turn", **expect, "max_steps": max(steps, len(script))}
    else:
        note = f"its turn ended {outcome}: the script replays what its history kept; expect its outcome by hand"
    return {"message": _text(opener["content"]), "script": script, "expect": expect}, note


async def record(settings: Settings, conversation_id: str) -> tuple[dict[str, Any], list[str]]:
    """The case of a conversation, and notes on what it could not keep. NotRecorded when it cannot be made."""
    from roundtrip._kernel.storage.ledger_reads import ConversationReads, TurnReads
    from roundtrip._kernel.storage.turnstore import ENDED

    store = await ConversationReads.open(settings.conversations_db_url, read_only=True)
    ledger = await TurnReads.open(settings.ledger_db_url, read_only=True)
    try:
        found = await store.get(conversation_id)
        if found is None:
            raise NotRecorded(f"no conversation {conversation_id} (see `roundtrip conversations`)")
        rows = await ledger.list(customer_id=found.customer_id, limit=TURNS_READ)
        mine = sorted((r for r in rows if r.conversation_id == conversation_id), key=lambda r: r.started_at)
        turns, notes = [], []
        for i, row in enumerate(mine):
            if row.status != ENDED:
                notes.append(f"turn {i + 1} ({row.turn_id}) has not ended: left out")
                continue
            exchange = await store.exchange(row.turn_id)
            if exchange is None:
                raise NotRecorded(
                    f"turn {row.turn_id} of {conversation_id} is no longer in its history (past the conversation's "
                    "token budget, or forgotten)"
                )
            turn, note = turn_case(exchange, row.outcome, row.step)
            turns.append(turn)
            if note:
                notes.append(f"turn {i + 1}: {note}")
    finally:
        await store.close()
        await ledger.close()
    if not turns:
        raise NotRecorded(f"conversation {conversation_id} has no ended turn to record")
    case = {
        "description": f"recorded from conversation {conversation_id}",
        "customer": found.customer_id,
        "turns": turns,
    }
    return case, notes
