"""The conversation store: who owns each conversation (the customer whose request first named it), and its history.

Each turn is stored as one exchange, from a user message to an assistant message, so exchanges concatenate into a
valid Messages API transcript and dropping whole ones never splits a tool_use from its tool_result. The oldest go past
the token budget (`history_tokens`); one alone over it is compacted. A conversation idle past `retention_s` is deleted
(the sweeper), `forget` erases one now, and a turn still running in a forgotten conversation stores nothing.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    bindparam,
    delete,
    exists,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from roundtrip._kernel.database import POOL_SIZE
from roundtrip._kernel.storage.ledger_reads import ConversationReads, conversations, exchanges
from roundtrip._kernel.storage.turnstore import TurnStore
from roundtrip._kernel.wire.limits import OMITTED_KEY

# built once; `b_` names are the conditions
_OF_CONVERSATION = conversations.c.conversation_id == bindparam("b_conversation_id")
_OWNER = select(
    conversations.c.customer_id, conversations.c.updated_at, conversations.c.turns, conversations.c.agent_version
).where(_OF_CONVERSATION)
_TOUCH = update(conversations).where(_OF_CONVERSATION)
_NEW_CONVERSATION = insert(conversations)
_NEW_EXCHANGE = insert(exchanges)
_STORED = (
    select(exchanges.c.turn_id, exchanges.c.tokens, exchanges.c.messages)
    .where(exchanges.c.conversation_id == bindparam("b_conversation_id"), exchanges.c.messages.is_not(None))
    .order_by(exchanges.c.started_at, exchanges.c.turn_id)
)
_EXCHANGES = (
    select(
        exchanges.c.turn_id, exchanges.c.tokens, exchanges.c.ended_at, exchanges.c.messages.is_not(None).label("stored")
    )
    .where(exchanges.c.conversation_id == bindparam("b_conversation_id"))
    .order_by(exchanges.c.started_at, exchanges.c.turn_id)
)
_THIS_EXCHANGE = (exchanges.c.turn_id == bindparam("b_turn_id")) & (
    exchanges.c.conversation_id == bindparam("b_conversation_id")
)
_STORE = update(exchanges).where(_THIS_EXCHANGE)
_CLAIMS: dict[str, Any] = {}  # dialect name -> the upsert of `claim` (each dialect has its own ON CONFLICT)


def _claim_statement(dialect: str) -> Any:
    """New: insert it. The customer's own, within its retention: touch it. Else (another's, expired): no row."""
    if (statement := _CLAIMS.get(dialect)) is None:
        new = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(conversations)
        statement = _CLAIMS[dialect] = new.on_conflict_do_update(
            index_elements=[conversations.c.conversation_id],
            set_={"updated_at": new.excluded.updated_at},
            where=(conversations.c.customer_id == new.excluded.customer_id)
            & (conversations.c.updated_at >= bindparam("b_cutoff")),
        ).returning(conversations.c.customer_id, conversations.c.turns, conversations.c.agent_version)
    return statement


_COUNT = (
    update(conversations)
    .where(_OF_CONVERSATION)
    .values(updated_at=bindparam("b_now"), turns=conversations.c.turns + bindparam("b_turns"))
)
_DROPPED = (
    update(conversations)
    .where(_OF_CONVERSATION)
    .values(dropped_turns=conversations.c.dropped_turns + bindparam("b_dropped"))
)


def _close_in_one() -> Any:
    """PostgreSQL's `close_turn` in one statement; it returns the exchanges as they were before it (every part of a
    WITH sees the same snapshot), from which the caller tells what falls out of the budget."""
    before = select(exchanges.c.ended_at).where(_THIS_EXCHANGE).cte("before")
    stored = (
        update(exchanges)
        .where(_THIS_EXCHANGE)
        .values(
            messages=bindparam("b_messages"),
            tokens=bindparam("b_tokens"),
            ended_at=bindparam("b_ended_at"),
            outcome=bindparam("b_outcome"),
        )
        .returning(exchanges.c.turn_id)
        .cte("stored")
    )
    first = select(func.count()).select_from(before).where(before.c.ended_at.is_(None)).scalar_subquery()
    counted = (
        update(conversations)
        .where(_OF_CONVERSATION, exists(select(stored.c.turn_id)))
        .values(updated_at=bindparam("b_now"), turns=conversations.c.turns + first)
        .returning(conversations.c.turns)
        .cte("counted")
    )
    return (
        select(
            exchanges.c.turn_id,
            exchanges.c.tokens,
            exchanges.c.messages.is_not(None).label("stored"),
            select(func.count()).select_from(stored).scalar_subquery().label("stored_now"),
            select(func.count()).select_from(counted).scalar_subquery().label("counted"),
        )
        .where(exchanges.c.conversation_id == bindparam("b_conversation_id"))
        .order_by(exchanges.c.started_at, exchanges.c.turn_id)
    )


_CLOSE_IN_ONE = _close_in_one()


def estimate_tokens(value: Any) -> int:
    """About 4 characters a token."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return math.ceil(len(text) / 4)


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content.strip() else []
    return [
        b
        for b in content or []
        if isinstance(b, dict) and not (b.get("type") == "text" and not str(b.get("text", "")).strip())
    ]


def exchange_of(
    turn_messages: list[dict[str, Any]], final_content: list[dict[str, Any]], reply_text: str
) -> list[dict[str, Any]]:
    """One turn as history, ending with what the customer was told; tool calls never answered are left out."""
    messages: list[dict[str, Any]] = []
    for message in [*turn_messages, {"role": "assistant", "content": final_content}]:
        blocks = _blocks(message.get("content"))
        if blocks:
            messages.append({"role": message["role"], "content": blocks})
    # a tool_use is kept only when the next message answers it with a tool_result
    kept: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            answered = {
                b.get("tool_use_id")
                for b in (messages[i + 1]["content"] if i + 1 < len(messages) else [])
                if b.get("type") == "tool_result"
            }
            blocks = [b for b in message["content"] if b.get("type") != "tool_use" or b.get("id") in answered]
            if not blocks:
                continue
            message = {"role": "assistant", "content": blocks}
        elif kept and kept[-1]["role"] == "user":  # two user messages in a row (a dropped assistant between): merge
            kept[-1] = {"role": "user", "content": [*kept[-1]["content"], *message["content"]]}
            continue
        kept.append(message)
    # tool_results whose tool_use was dropped cannot stay either
    for i, message in enumerate(kept):
        if message["role"] == "user" and i > 0:
            offered = {b.get("id") for b in kept[i - 1]["content"] if b.get("type") == "tool_use"}
            blocks = [
                b for b in message["content"] if b.get("type") != "tool_result" or b.get("tool_use_id") in offered
            ]
            kept[i] = {"role": "user", "content": blocks or [{"type": "text", "text": "(no answer)"}]}
    said = "\n".join(
        b.get("text", "")
        for b in (kept[-1]["content"] if kept and kept[-1]["role"] == "assistant" else [])
        if b.get("type") == "text"
    ).strip()
    if reply_text and reply_text.strip() != said:
        if (
            kept
            and kept[-1]["role"] == "assistant"
            and not any(b.get("type") == "tool_use" for b in kept[-1]["content"])
        ):
            kept[-1] = {"role": "assistant", "content": [{"type": "text", "text": reply_text}]}
        else:
            kept.append({"role": "assistant", "content": [{"type": "text", "text": reply_text}]})
    if not kept or kept[0]["role"] != "user":
        kept.insert(0, {"role": "user", "content": [{"type": "text", "text": "(earlier message)"}]})
    return kept


def compact(messages: list[dict[str, Any]], budget_tokens: int) -> list[dict[str, Any]]:
    """An exchange with its largest blocks replaced by markers until it fits; its tool_use/tool_result pairs stay."""
    if estimate_tokens(messages) <= budget_tokens:
        return messages
    messages = json.loads(json.dumps(messages))
    slots = []
    for message in messages:
        for block in message["content"] if isinstance(message["content"], list) else []:
            field = {"tool_use": "input", "tool_result": "content", "text": "text"}.get(block.get("type"))
            if field and field in block:
                slots.append((estimate_tokens(block[field]), block, field))
    total = estimate_tokens(messages)
    for size, block, field in sorted(slots, key=lambda s: -s[0]):
        if total <= budget_tokens:
            break
        note = f"[removed from the history by roundtrip: about {size} tokens, over the conversation's budget]"
        block[field] = {OMITTED_KEY: note} if field == "input" else note
        total -= size - estimate_tokens(block[field])
    return messages


def within_budget(stored: list[tuple[str, int]], budget_tokens: int) -> tuple[list[str], list[str]]:
    """(kept, dropped) turn ids: the newest that fit in the budget together."""
    kept: list[str] = []
    total = 0
    for turn_id, tokens in reversed(stored):
        if total + tokens > budget_tokens:
            break
        kept.append(turn_id)
        total += tokens
    kept.reverse()
    dropped = [turn_id for turn_id, _ in stored[: len(stored) - len(kept)]]
    return kept, dropped


class Claim(NamedTuple):
    """Who owns the conversation, how many of its turns were ever stored (0: no history to read), and the agent
    version its turns run on ("": the default version)."""

    owner: str
    stored_turns: int
    agent_version: str


class Conversations(ConversationReads):
    budget_tokens: int = 20000
    retention_s: float = 30 * 86400.0

    @classmethod
    async def open(  # type: ignore[override]  # its budget and retention come before the store's own options
        cls,
        url: str,
        budget_tokens: int = 20000,
        retention_s: float = 30 * 86400.0,
        read_only: bool = False,
        pool_size: int = POOL_SIZE,
    ) -> Conversations:
        store = await super().open(url, read_only=read_only, pool_size=pool_size)
        store.budget_tokens, store.retention_s = budget_tokens, retention_s
        return store

    async def claim(self, conversation_id: str, customer_id: str, version: str, now: float) -> Claim:
        """The owner: `customer_id` when new (or expired), else whoever started it; one upsert on the common path. A
        new conversation is assigned agent version `version`; an existing one keeps its own."""
        new = {
            "conversation_id": conversation_id,
            "customer_id": customer_id,
            "created_at": now,
            "updated_at": now,
            "turns": 0,
            "dropped_turns": 0,
            "agent_version": version,
        }
        params = {**new, "b_cutoff": now - self.retention_s}
        row = await self._run(
            lambda conn: conn.execute(_claim_statement(conn.dialect.name), params).first(), write=True, single=True
        )
        if row is not None:
            return Claim(row.customer_id, row.turns, row.agent_version or "")

        def work(conn: Connection) -> Claim:
            row = conn.execute(_OWNER, {"b_conversation_id": conversation_id}).first()
            if row is not None and row.updated_at < now - self.retention_s:  # expired: as if it never existed
                _delete(conn, conversation_id)
                row = None
            if row is not None:
                if row.customer_id == customer_id:  # in use: not idle any more
                    conn.execute(_TOUCH, {"b_conversation_id": conversation_id, "updated_at": now})
                return Claim(row.customer_id, row.turns, row.agent_version or "")
            conn.execute(_NEW_CONVERSATION, new)
            return Claim(customer_id, 0, version)

        for _ in range(3):
            try:
                return await self._run(work, write=True)
            except IntegrityError:  # created by someone else at the same moment: read it
                continue
        raise RuntimeError(f"could not claim conversation {conversation_id}")

    async def pin(self, conversation_id: str, version: str) -> None:
        """Its later turns run on agent version `version` (the one it was on drains)."""
        await self._run(
            lambda conn: conn.execute(_TOUCH, {"b_conversation_id": conversation_id, "agent_version": version}),
            write=True,
            single=True,
        )

    async def open_turn(self, conversation_id: str, turn_id: str, text: str, now: float) -> None:
        with contextlib.suppress(IntegrityError):  # open already: the start was redelivered
            await self._run(
                lambda conn: conn.execute(
                    _NEW_EXCHANGE,
                    {
                        "turn_id": turn_id,
                        "conversation_id": conversation_id,
                        "started_at": now,
                        "text": text,
                        "tokens": 0,
                    },
                ),
                write=True,
                single=True,
            )

    async def history(self, conversation_id: str) -> list[dict[str, Any]]:
        rows = await self._run(
            lambda conn: conn.execute(_STORED, {"b_conversation_id": conversation_id}).all(), single=True
        )
        kept, _ = within_budget([(r.turn_id, r.tokens) for r in rows], self.budget_tokens)
        wanted = set(kept)
        return [m for r in rows if r.turn_id in wanted for m in json.loads(r.messages)]

    def shares(self, ledger: TurnStore) -> bool:
        """One database with the ledger: a turn's history is written in the transaction of its end."""
        url = self.engine.url
        return url == ledger.engine.url and url.database not in (None, "", ":memory:")

    async def close_turn(
        self,
        conversation_id: str,
        turn_id: str,
        turn_messages: list[dict[str, Any]],
        final_content: list[dict[str, Any]],
        reply_text: str,
        outcome: str,
        now: float,
    ) -> bool:
        """Store the ended turn's exchange, then drop the oldest past the budget; False when the turn is gone."""
        closing = self.closing(conversation_id, turn_id, turn_messages, final_content, reply_text, outcome, now)
        return await self.store(closing)

    async def store(self, closing: Callable[[Connection], bool]) -> bool:
        return await self._run(closing, write=True)

    def closing(
        self,
        conversation_id: str,
        turn_id: str,
        turn_messages: list[dict[str, Any]],
        final_content: list[dict[str, Any]],
        reply_text: str,
        outcome: str,
        now: float,
        only_open: bool = False,
    ) -> Callable[[Connection], bool]:
        """`close_turn`'s writes, run on a connection of the caller's transaction (the ledger's, when they share a
        database); `only_open`: nothing when the exchange is stored already."""
        exchange = compact(exchange_of(turn_messages, final_content, reply_text), self.budget_tokens)
        tokens = estimate_tokens(exchange)

        of_turn = {"b_turn_id": turn_id, "b_conversation_id": conversation_id, "b_now": now}
        values = {"messages": json.dumps(exchange), "tokens": tokens, "ended_at": now, "outcome": outcome}

        def work(conn: Connection) -> bool:
            if conn.dialect.name == "postgresql" and not only_open:
                given = {**of_turn, **{f"b_{k}": v for k, v in values.items()}}
                rows = conn.execute(_CLOSE_IN_ONE, given).all()
                if not rows or rows[0].stored_now != 1:  # forgotten, expired, or never opened
                    return False
                if dropped := self._dropped(rows, turn_id, tokens):
                    _drop(conn, conversation_id, dropped)
                return True
            rows = conn.execute(_EXCHANGES, {"b_conversation_id": conversation_id}).all()
            this = next((r for r in rows if r.turn_id == turn_id), None)
            if this is None or (only_open and this.ended_at is not None):
                return False
            first = this.ended_at is None  # a redelivery or a fuller end counts no second turn
            if conn.execute(_STORE, {**of_turn, **values}).rowcount != 1:
                return False
            conn.execute(_COUNT, {**of_turn, "b_turns": int(first)})
            if dropped := self._dropped(rows, turn_id, tokens):
                _drop(conn, conversation_id, dropped)
            return True

        return work

    async def still_open(self, turn_ids: list[str]) -> list[str]:
        """Those of `turn_ids` whose exchange is opened but not stored yet."""
        if not turn_ids:
            return []
        return await self._run(
            lambda conn: list(
                conn.execute(
                    select(exchanges.c.turn_id).where(exchanges.c.turn_id.in_(turn_ids), exchanges.c.ended_at.is_(None))
                ).scalars()
            ),
            single=True,
        )

    def _dropped(self, rows: Sequence[Any], turn_id: str, tokens: int) -> list[str]:
        """The exchanges that fall out of the budget once `turn_id` is stored with `tokens`."""
        stored = [
            (r.turn_id, tokens if r.turn_id == turn_id else r.tokens) for r in rows if r.turn_id == turn_id or r.stored
        ]
        return within_budget(stored, self.budget_tokens)[1]

    async def close_turn_with_reply(self, conversation_id: str, turn_id: str, reply_text: str, outcome: str) -> bool:
        """A turn ended from outside the loop (cancel, deadline): its words and the reply, without its tool calls."""
        rows = await self._run(
            lambda conn: conn.execute(select(exchanges.c.text).where(exchanges.c.turn_id == turn_id)).all()
        )
        if not rows:
            return False
        return await self.close_turn(
            conversation_id, turn_id, [{"role": "user", "content": rows[0].text}], [], reply_text, outcome, time.time()
        )

    async def forget(self, conversation_id: str) -> bool:
        return await self._run(lambda conn: _delete(conn, conversation_id), write=True)

    async def expire(self, now: float | None = None) -> int:
        cutoff = (now or time.time()) - self.retention_s

        def work(conn: Connection) -> int:
            old = [
                r.conversation_id
                for r in conn.execute(
                    select(conversations.c.conversation_id).where(conversations.c.updated_at < cutoff).limit(1000)
                ).all()
            ]
            for conversation_id in old:
                _delete(conn, conversation_id)
            return len(old)

        return await self._run(work, write=True)


def _drop(conn: Connection, conversation_id: str, dropped: list[str]) -> None:
    conn.execute(delete(exchanges).where(exchanges.c.turn_id.in_(dropped)))
    conn.execute(_DROPPED, {"b_conversation_id": conversation_id, "b_dropped": len(dropped)})


def _delete(conn: Connection, conversation_id: str) -> bool:
    conn.execute(delete(exchanges).where(exchanges.c.conversation_id == conversation_id))
    return conn.execute(delete(conversations).where(conversations.c.conversation_id == conversation_id)).rowcount == 1
