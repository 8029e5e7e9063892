"""The demo shop's database: SQLAlchemy Core, async, one code path for SQLite and PostgreSQL.

Every query that touches customer data filters on the principal's `customer_id`, so another customer's order is
indistinguishable from a missing one. `cancel_order` is one `UPDATE ... WHERE order_id AND customer_id AND status IN
(cancellable)`, so two concurrent cancels cannot both win; its outcome is stored under (customer_id, idempotency key)
in the same transaction, so a replay returns the first response. Every write request is first appended to
`executions` (before the replay check): the count of side effects asked for, replays included.
"""

from __future__ import annotations

import uuid
import weakref
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    Date,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from roundtrip._kernel.storage.turnstore import sqlite_locked
from roundtrip._shop.demo_data import DEMO_CUSTOMERS, DEMO_ORDERS

STATUSES = ("pending", "processing", "shipped", "delivered", "cancelled")
CANCELLABLE = ("pending", "processing")
DEFAULT_LIMIT = 20
MAX_LIMIT = 50

metadata = MetaData()

customers = Table(
    "customers",
    metadata,
    Column("customer_id", String(64), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("email", String(200), nullable=False),
)

orders = Table(
    "orders",
    metadata,
    Column("order_id", String(32), primary_key=True),
    Column("customer_id", String(64), ForeignKey("customers.customer_id"), nullable=False),
    Column("status", String(16), nullable=False),
    Column("placed_at", DateTime(timezone=True), nullable=False),
    Column("total_cents", Integer, nullable=False),
    Column("currency", String(3), nullable=False),
    Column("items", JSON, nullable=False),
    Column("carrier", String(64)),
    Column("tracking_number", String(64)),
    Column("eta", Date),
    Column("cancel_reason", String(500)),
    Column("cancelled_at", DateTime(timezone=True)),
    Index("ix_orders_customer_placed", "customer_id", "placed_at"),
)

idempotency = Table(
    "idempotency",
    metadata,
    Column("customer_id", String(64), primary_key=True),
    Column("key", String(255), primary_key=True),
    Column("endpoint", String(64), nullable=False),
    Column("request", JSON, nullable=False),
    Column("status_code", Integer, nullable=False),
    Column("response", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

# Append-only: one row per write request under an idempotency key, replays and conflicts included.
executions = Table(
    "executions",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("customer_id", String(64), nullable=False),
    Column("key", String(255), nullable=False),
    Column("endpoint", String(64), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Index("ix_executions_key", "customer_id", "key"),
)

escalations = Table(
    "escalations",
    metadata,
    Column("ticket_id", String(32), primary_key=True),
    Column("customer_id", String(64), nullable=False, index=True),
    Column("summary", Text, nullable=False),
    Column("urgency", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)


# SQLite file -> a plain engine on the same file for reads, run inline on the event loop (see `_read`)
_inline_readers: weakref.WeakKeyDictionary[AsyncEngine, Engine] = weakref.WeakKeyDictionary()


def make_engine(database_url: str) -> AsyncEngine:
    """An async engine for `sqlite+aiosqlite:///...` or `postgresql+asyncpg://...`: only connection set-up differs
    per backend, every query is the same."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.close()

        if url.database and url.database != ":memory:":
            _inline_readers[engine] = create_engine(url.set(drivername="sqlite"), connect_args={"timeout": 0})
        return engine
    return create_async_engine(url, pool_pre_ping=True)


async def _read(engine: AsyncEngine, query: Any) -> list[Any]:
    """The rows of a read-only query: on a SQLite file run inline on the event loop, since aiosqlite's hop to its
    thread costs more than a read of the local file (docs/decisions/ledger-statements.md). A reader never waits for a
    writer in WAL mode; when SQLite reports the file locked anyway, the async engine runs the query."""
    inline = _inline_readers.get(engine)
    if inline is not None:
        try:
            with inline.connect() as conn:
                return list(conn.execute(query))
        except OperationalError as exc:
            if not sqlite_locked(exc):
                raise
    async with engine.connect() as conn:
        return list(await conn.execute(query))


async def dispose(engine: AsyncEngine) -> None:
    """Close the engine's connections (and those of its inline reader)."""
    inline = _inline_readers.pop(engine, None)
    if inline is not None:
        inline.dispose()
    await engine.dispose()


async def create_schema(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)


async def seed_demo_data(engine: AsyncEngine) -> int:
    """Insert the demo customers and orders that are missing; the rows inserted. Existing rows are neither duplicated
    nor reset, and several processes may run it at once."""
    for attempt in range(3):
        try:
            async with engine.begin() as conn:
                have_c = set((await conn.execute(select(customers.c.customer_id))).scalars())
                have_o = set((await conn.execute(select(orders.c.order_id))).scalars())
                new_c = [c for c in DEMO_CUSTOMERS if c["customer_id"] not in have_c]
                new_o = [o for o in DEMO_ORDERS if o["order_id"] not in have_o]
                if new_c:
                    await conn.execute(insert(customers), new_c)
                if new_o:
                    await conn.execute(insert(orders), new_o)
                return len(new_c) + len(new_o)
        except IntegrityError:  # another process seeded concurrently: look again
            if attempt == 2:
                raise
    return 0


async def reset_demo_data(engine: AsyncEngine) -> None:
    """Put the demo data back to its initial state (for a demo run again; drops everything else)."""
    async with engine.begin() as conn:
        for table in (executions, idempotency, escalations, orders, customers):
            await conn.execute(delete(table))
        await conn.execute(insert(customers), DEMO_CUSTOMERS)
        await conn.execute(insert(orders), DEMO_ORDERS)


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:  # SQLite keeps no offset; everything is stored in UTC
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def order_json(row: Any) -> dict[str, Any]:
    m = row._mapping
    return {
        "order_id": m["order_id"],
        "customer_id": m["customer_id"],
        "status": m["status"],
        "placed_at": _iso(m["placed_at"]),
        "total_cents": m["total_cents"],
        "currency": m["currency"],
        "items": m["items"],
        "carrier": m["carrier"],
        "tracking_number": m["tracking_number"],
        "eta": m["eta"].isoformat() if m["eta"] else None,
        "cancel_reason": m["cancel_reason"],
        "cancelled_at": _iso(m["cancelled_at"]),
    }


def shipping_json(order: dict[str, Any]) -> dict[str, Any]:
    return {k: order[k] for k in ("order_id", "status", "carrier", "tracking_number", "eta")}


def _order_query(customer_id: str, order_id: str) -> Any:
    return select(orders).where(orders.c.order_id == order_id, orders.c.customer_id == customer_id)


async def _get_order(conn: AsyncConnection, customer_id: str, order_id: str) -> dict[str, Any] | None:
    row = (await conn.execute(_order_query(customer_id, order_id))).first()
    return order_json(row) if row is not None else None


async def get_order(engine: AsyncEngine, customer_id: str, order_id: str) -> dict[str, Any] | None:
    """The order if it exists AND belongs to `customer_id`; None otherwise (no difference)."""
    rows = await _read(engine, _order_query(customer_id, order_id))
    return order_json(rows[0]) if rows else None


async def list_orders(engine: AsyncEngine, customer_id: str, status: str | None, limit: int) -> list[dict[str, Any]]:
    """The principal's orders, newest first; `limit` is clamped to 1..50."""
    limit = max(1, min(int(limit), MAX_LIMIT))
    query = select(orders).where(orders.c.customer_id == customer_id)
    if status is not None:
        query = query.where(orders.c.status == status)
    query = query.order_by(orders.c.placed_at.desc(), orders.c.order_id.desc()).limit(limit)
    return [order_json(r) for r in await _read(engine, query)]


async def shipping_status(engine: AsyncEngine, customer_id: str, order_id: str) -> dict[str, Any] | None:
    order = await get_order(engine, customer_id, order_id)
    return shipping_json(order) if order is not None else None


async def admin_orders(engine: AsyncEngine) -> list[dict[str, Any]]:
    """Every order with its owner (no principal: the demo shop's own admin view)."""
    query = (
        select(orders, customers.c.name.label("customer_name"))
        .join(customers, customers.c.customer_id == orders.c.customer_id)
        .order_by(orders.c.placed_at.desc(), orders.c.order_id.desc())
    )
    return [order_json(r) | {"customer_name": r._mapping["customer_name"]} for r in await _read(engine, query)]


@dataclass(frozen=True)
class Outcome:
    """An HTTP-shaped result of a write: what the API returns, and whether it was a replay."""

    status_code: int
    body: dict[str, Any]
    replayed: bool = False


NOT_FOUND_BODY = {"error": "order_not_found", "message": "No such order for this customer."}


def not_cancellable_body(order_id: str, status: str) -> dict[str, Any]:
    return {
        "error": "not_cancellable",
        "order_id": order_id,
        "status": status,
        "message": f"Order {order_id} is {status}; only pending or processing orders can be cancelled.",
    }


def _conflict(key: str) -> Outcome:
    return Outcome(
        422,
        {
            "error": "idempotency_conflict",
            "message": f"Idempotency-Key {key!r} was already used for a different request.",
        },
    )


async def _log_execution(engine: AsyncEngine, customer_id: str, key: str, endpoint: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            insert(executions).values(customer_id=customer_id, key=key, endpoint=endpoint, at=datetime.now(UTC))
        )


async def _replay(
    engine: AsyncEngine, customer_id: str, key: str, endpoint: str, request: dict[str, Any]
) -> Outcome | None:
    rows = await _read(
        engine, select(idempotency).where(idempotency.c.customer_id == customer_id, idempotency.c.key == key)
    )
    if not rows:
        return None
    m = rows[0]._mapping
    if m["endpoint"] != endpoint or m["request"] != request:
        return _conflict(key)
    return Outcome(m["status_code"], m["response"], replayed=True)


async def _remember(
    conn: AsyncConnection, customer_id: str, key: str, endpoint: str, request: dict[str, Any], outcome: Outcome
) -> None:
    await conn.execute(
        insert(idempotency).values(
            customer_id=customer_id,
            key=key,
            endpoint=endpoint,
            request=request,
            status_code=outcome.status_code,
            response=outcome.body,
            created_at=datetime.now(UTC),
        )
    )


async def cancel_order(
    engine: AsyncEngine, customer_id: str, order_id: str, reason: str, idempotency_key: str
) -> Outcome:
    """Cancel the principal's order once. 200 order | 404 not found | 409 not cancellable | 422 key reuse."""
    endpoint, request = "cancel_order", {"order_id": order_id, "reason": reason}
    await _log_execution(engine, customer_id, idempotency_key, endpoint)
    if (seen := await _replay(engine, customer_id, idempotency_key, endpoint, request)) is not None:
        return seen
    try:
        async with engine.begin() as conn:
            # the first statement writes: on SQLite the transaction holds the write lock from here on; on PostgreSQL
            # a concurrent UPDATE waits and re-checks the WHERE
            changed = await conn.execute(
                update(orders)
                .where(
                    orders.c.order_id == order_id,
                    orders.c.customer_id == customer_id,
                    orders.c.status.in_(CANCELLABLE),
                )
                .values(status="cancelled", cancel_reason=reason, cancelled_at=datetime.now(UTC))
            )
            order = await _get_order(conn, customer_id, order_id)
            if changed.rowcount == 1 and order is not None:
                outcome = Outcome(200, order)
            elif order is None:
                outcome = Outcome(404, dict(NOT_FOUND_BODY))
            else:
                outcome = Outcome(409, not_cancellable_body(order_id, order["status"]))
            await _remember(conn, customer_id, idempotency_key, endpoint, request, outcome)
    except IntegrityError:
        # the same key won a race in another transaction; ours was rolled back in full
        seen = await _replay(engine, customer_id, idempotency_key, endpoint, request)
        if seen is None:
            raise
        return seen
    return outcome


async def create_escalation(
    engine: AsyncEngine, customer_id: str, summary: str, urgency: str, idempotency_key: str
) -> Outcome:
    """Open a ticket for a human agent once per key. 201 {"ticket_id", ...} | 422 key reuse."""
    endpoint, request = "escalate", {"summary": summary, "urgency": urgency}
    await _log_execution(engine, customer_id, idempotency_key, endpoint)
    if (seen := await _replay(engine, customer_id, idempotency_key, endpoint, request)) is not None:
        return seen
    ticket_id = f"tkt_{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                insert(escalations).values(
                    ticket_id=ticket_id,
                    customer_id=customer_id,
                    summary=summary,
                    urgency=urgency,
                    status="open",
                    created_at=now,
                )
            )
            outcome = Outcome(
                201, {"ticket_id": ticket_id, "status": "open", "urgency": urgency, "created_at": _iso(now)}
            )
            await _remember(conn, customer_id, idempotency_key, endpoint, request, outcome)
    except IntegrityError:
        seen = await _replay(engine, customer_id, idempotency_key, endpoint, request)
        if seen is None:
            raise
        return seen
    return outcome


async def count_executions(engine: AsyncEngine, customer_id: str, key: str) -> int:
    """How many times a write under this key was asked for (the first run and every replay)."""
    query = select(func.count()).select_from(executions)
    query = query.where(executions.c.customer_id == customer_id, executions.c.key == key)
    return int((await _read(engine, query))[0][0])
