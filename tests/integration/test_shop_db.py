"""The shop's database functions on both backends: SQLite (a temp file) and PostgreSQL.

Same code path, same assertions: ownership, idempotent and atomic cancellation, seeding.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import create_async_engine

from roundtrip._shop import db

ALICE, BOB, CAROL = "cus_1001", "cus_1002", "cus_1003"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def engine(request, tmp_path):
    drop = None
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'shop.db'}"
    else:
        base = request.getfixturevalue("postgres_url")
        name = f"shop_test_{uuid.uuid4().hex[:10]}"
        admin = create_async_engine(base, isolation_level="AUTOCOMMIT")
        try:  # a fresh database per test
            async with admin.connect() as conn:
                await conn.execute(text(f'CREATE DATABASE "{name}"'))
        except DBAPIError:  # no CREATEDB right: reuse the given database, emptied
            await admin.dispose()
            url = base
            reset = db.make_engine(url)
            async with reset.begin() as conn:
                await conn.run_sync(db.metadata.drop_all)
            await reset.dispose()
        else:
            url = make_url(base).set(database=name).render_as_string(hide_password=False)

            async def drop():
                async with admin.connect() as conn:
                    await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                await admin.dispose()

    eng = db.make_engine(url)
    await db.create_schema(eng)
    await db.seed_demo_data(eng)
    yield eng
    await eng.dispose()
    if drop is not None:
        await drop()


async def _count(engine, table) -> int:
    async with engine.connect() as conn:
        return (await conn.execute(select(func.count()).select_from(table))).scalar_one()


# -- seeding ---------------------------------------------------------------------------------------


async def test_seed_is_idempotent_and_does_not_reset(engine):
    assert await _count(engine, db.customers) == 3
    assert await _count(engine, db.orders) == 8
    outcome = await db.cancel_order(engine, ALICE, "ord_a1000003", "customer_request", "seed-k1")
    assert outcome.status_code == 200
    await db.create_schema(engine)  # re-running the schema creation is harmless too
    assert await db.seed_demo_data(engine) == 0
    assert await db.seed_demo_data(engine) == 0
    assert await _count(engine, db.customers) == 3
    assert await _count(engine, db.orders) == 8
    assert (await db.get_order(engine, ALICE, "ord_a1000003"))["status"] == "cancelled"


async def test_concurrent_seeding_is_safe(engine):
    results = await asyncio.gather(*(db.seed_demo_data(engine) for _ in range(4)))
    assert results == [0, 0, 0, 0]
    assert await _count(engine, db.orders) == 8


async def orders_of(engine, customer_id: str, status: str | None = None, limit: int = db.DEFAULT_LIMIT) -> list:
    """The customer's orders as the shop's GET /orders gives them: of any status, the default page unless given."""
    return await db.list_orders(engine, customer_id, status, limit)


async def test_demo_data(engine):
    alice = await orders_of(engine, ALICE)
    assert [o["order_id"] for o in alice] == ["ord_a1000003", "ord_a1000004", "ord_a1000002", "ord_a1000001"]
    assert [o["status"] for o in alice] == ["pending", "processing", "shipped", "delivered"]
    assert alice[0]["placed_at"].startswith("2026-11-25T")
    bob = {o["order_id"]: o["status"] for o in await orders_of(engine, BOB)}
    assert bob == {"ord_9f3c4e21": "processing", "ord_b2000001": "delivered"}
    carol = {o["order_id"]: o["status"] for o in await orders_of(engine, CAROL)}
    assert carol == {"ord_c3000001": "shipped", "ord_c3000002": "delivered"}
    shipped = await db.shipping_status(engine, ALICE, "ord_a1000002")
    assert shipped["carrier"] and shipped["tracking_number"] and shipped["eta"]
    every = await db.admin_orders(engine)
    assert {o["order_id"]: o["customer_name"] for o in every}["ord_9f3c4e21"] == "Bob Okafor"


async def test_list_filters_and_limits(engine):
    assert [o["order_id"] for o in await orders_of(engine, ALICE, status="shipped")] == ["ord_a1000002"]
    assert len(await orders_of(engine, ALICE, limit=2)) == 2
    assert len(await orders_of(engine, ALICE, limit=500)) == 4  # clamped to 50
    assert await orders_of(engine, "cus_nobody") == []


# -- ownership -------------------------------------------------------------------------------------


async def test_other_customers_order_is_indistinguishable_from_missing(engine):
    assert await db.get_order(engine, BOB, "ord_a1000003") is None
    assert await db.get_order(engine, BOB, "ord_deadbeef") is None
    assert await db.shipping_status(engine, BOB, "ord_a1000002") is None
    assert "ord_a1000003" not in {o["order_id"] for o in await orders_of(engine, BOB)}

    foreign = await db.cancel_order(engine, BOB, "ord_a1000003", "other", "own-k1")
    missing = await db.cancel_order(engine, BOB, "ord_deadbeef", "other", "own-k2")
    assert foreign.status_code == missing.status_code == 404
    assert foreign.body == missing.body
    assert (await db.get_order(engine, ALICE, "ord_a1000003"))["status"] == "pending"


async def test_the_canonical_incident_cannot_cancel_bobs_order(engine):
    outcome = await db.cancel_order(engine, ALICE, "ord_9f3c4e21", "customer_request", "incident-k1")
    assert outcome.status_code == 404
    assert (await db.get_order(engine, BOB, "ord_9f3c4e21"))["status"] == "processing"


# -- cancellation ----------------------------------------------------------------------------------


async def test_cancel_is_idempotent_by_key(engine):
    first = await db.cancel_order(engine, ALICE, "ord_a1000003", "customer_request", "k-same")
    second = await db.cancel_order(engine, ALICE, "ord_a1000003", "customer_request", "k-same")
    assert first.status_code == second.status_code == 200
    assert first.body == second.body
    assert first.body["status"] == "cancelled" and first.body["cancel_reason"] == "customer_request"
    assert (first.replayed, second.replayed) == (False, True)
    assert (await db.get_order(engine, ALICE, "ord_a1000003"))["cancelled_at"] == first.body["cancelled_at"]
    # a new key for the same, now cancelled, order: not cancellable (never a second cancellation)
    third = await db.cancel_order(engine, ALICE, "ord_a1000003", "customer_request", "k-other")
    assert third.status_code == 409 and third.body["status"] == "cancelled"


async def test_every_run_of_a_write_is_logged_replays_and_conflicts_included(engine):
    """The execution log counts requests, not effects: a replay changes no other table, yet it is a second run."""
    await db.cancel_order(engine, ALICE, "ord_a1000003", "customer_request", "k-log")
    assert await db.count_executions(engine, ALICE, "k-log") == 1
    assert (await db.cancel_order(engine, ALICE, "ord_a1000003", "customer_request", "k-log")).replayed
    assert (await db.cancel_order(engine, ALICE, "ord_a1000004", "customer_request", "k-log")).status_code == 422
    await db.create_escalation(engine, ALICE, "Parcel arrived damaged", "high", "esc-log")
    await db.create_escalation(engine, ALICE, "Parcel arrived damaged", "high", "esc-log")
    assert await db.count_executions(engine, ALICE, "k-log") == 3
    assert await db.count_executions(engine, ALICE, "esc-log") == 2
    assert await db.count_executions(engine, BOB, "k-log") == 0
    assert await _count(engine, db.idempotency) == 2  # what the stored answers alone would say: one run each


async def test_same_key_for_a_different_order_is_a_conflict(engine):
    assert (await db.cancel_order(engine, ALICE, "ord_a1000003", "customer_request", "k-reuse")).status_code == 200
    reused = await db.cancel_order(engine, ALICE, "ord_a1000004", "customer_request", "k-reuse")
    assert reused.status_code == 422 and reused.body["error"] == "idempotency_conflict"
    assert (await db.get_order(engine, ALICE, "ord_a1000004"))["status"] == "processing"


async def test_idempotency_keys_are_scoped_to_the_customer(engine):
    a = await db.cancel_order(engine, ALICE, "ord_a1000003", "customer_request", "k-shared")
    b = await db.cancel_order(engine, BOB, "ord_9f3c4e21", "customer_request", "k-shared")
    assert a.status_code == b.status_code == 200
    assert a.body["order_id"] != b.body["order_id"]


@pytest.mark.parametrize("order_id, status", [("ord_a1000002", "shipped"), ("ord_a1000001", "delivered")])
async def test_not_cancellable(engine, order_id, status):
    outcome = await db.cancel_order(engine, ALICE, order_id, "customer_request", f"k-{order_id}")
    assert outcome.status_code == 409
    assert outcome.body["error"] == "not_cancellable" and outcome.body["status"] == status
    assert (await db.get_order(engine, ALICE, order_id))["status"] == status


async def test_processing_is_cancellable(engine):
    outcome = await db.cancel_order(engine, ALICE, "ord_a1000004", "wrong_item", "k-proc")
    assert outcome.status_code == 200 and outcome.body["status"] == "cancelled"


async def test_concurrent_cancels_with_different_keys_exactly_one_wins(engine):
    outcomes = await asyncio.gather(
        *(db.cancel_order(engine, ALICE, "ord_a1000003", "customer_request", f"race-{i}") for i in range(8))
    )
    codes = sorted(o.status_code for o in outcomes)
    assert codes == [200] + [409] * 7
    assert (await db.get_order(engine, ALICE, "ord_a1000003"))["status"] == "cancelled"


async def test_concurrent_cancels_with_the_same_key_give_one_result(engine):
    outcomes = await asyncio.gather(
        *(db.cancel_order(engine, ALICE, "ord_a1000003", "customer_request", "race-same") for _ in range(6))
    )
    assert {o.status_code for o in outcomes} == {200}
    assert len({o.body["cancelled_at"] for o in outcomes}) == 1
    assert sum(not o.replayed for o in outcomes) == 1


async def test_concurrent_same_key_on_two_orders_cancels_only_one(engine):
    outcomes = await asyncio.gather(
        db.cancel_order(engine, ALICE, "ord_a1000003", "customer_request", "race-two"),
        db.cancel_order(engine, ALICE, "ord_a1000004", "customer_request", "race-two"),
    )
    assert sorted(o.status_code for o in outcomes) == [200, 422]
    statuses = [(await db.get_order(engine, ALICE, oid))["status"] for oid in ("ord_a1000003", "ord_a1000004")]
    assert statuses.count("cancelled") == 1


# -- escalations -----------------------------------------------------------------------------------


async def escalations_of(engine, customer_id: str) -> int:
    """The tickets stored for one customer, read straight from the shop's table."""
    async with engine.connect() as conn:
        query = select(func.count()).select_from(db.escalations).where(db.escalations.c.customer_id == customer_id)
        return (await conn.execute(query)).scalar_one()


async def test_escalation_is_idempotent(engine):
    first = await db.create_escalation(engine, ALICE, "Parcel arrived damaged", "high", "esc-1")
    again = await db.create_escalation(engine, ALICE, "Parcel arrived damaged", "high", "esc-1")
    assert first.status_code == 201 and first.body == again.body and again.replayed
    assert first.body["ticket_id"].startswith("tkt_")
    assert await escalations_of(engine, ALICE) == 1
    other = await db.create_escalation(engine, ALICE, "Something else entirely", "low", "esc-1")
    assert other.status_code == 422


async def test_reset_restores_the_demo_data(engine):
    await db.cancel_order(engine, ALICE, "ord_a1000003", "customer_request", "reset-k")
    await db.reset_demo_data(engine)
    assert (await db.get_order(engine, ALICE, "ord_a1000003"))["status"] == "pending"
    assert await _count(engine, db.idempotency) == 0
    assert await _count(engine, db.executions) == 0


async def test_sqlite_reads_run_inline_and_wait_in_the_async_engine_when_the_file_is_locked(tmp_path, monkeypatch):
    """On a SQLite file reads run on the event loop through a plain engine (no thread hop); should SQLite
    ever report the file locked to a reader, the async engine (which waits for the lock) answers instead."""
    eng = db.make_engine(f"sqlite+aiosqlite:///{tmp_path / 'shop.db'}")
    await db.create_schema(eng)
    await db.seed_demo_data(eng)
    try:
        inline = db._inline_readers[eng]
        used: list[str] = []
        real_connect = inline.connect

        def counted_connect():
            used.append("inline")
            return real_connect()

        monkeypatch.setattr(inline, "connect", counted_connect)
        assert [o["order_id"] for o in await orders_of(eng, CAROL)] == ["ord_c3000001", "ord_c3000002"]
        assert used == ["inline"]

        def locked():
            raise OperationalError("SELECT", {}, Exception("database is locked"))

        monkeypatch.setattr(inline, "connect", locked)
        assert (await db.get_order(eng, ALICE, "ord_a1000002"))["status"] == "shipped"  # through aiosqlite's thread
        outcome = await db.cancel_order(eng, ALICE, "ord_a1000003", "customer_request", "locked-k1")
        assert outcome.status_code == 200 and not outcome.replayed
    finally:
        await db.dispose(eng)
    assert eng not in db._inline_readers
