"""The grants `roundtrip db roles` derives for a login per service (the database itself refuses the rest:
tests/integration/test_database_roles.py), and that the columns granted are exactly the ones the claims write."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest
from sqlalchemy import event, insert

from roundtrip._kernel.storage import roles
from roundtrip._kernel.storage.turnstore import ENDING, RUNNING, Fence, turns
from roundtrip._kernel.wire import topology
from tests.databases import migrated

ALL = ["turns", "approvals", "conversations", "conversation_turns"]


def of(statements: list[str], login: str) -> list[str]:
    return [s for s in statements if re.search(rf"\b{login}\b", s)]


def test_every_service_that_shares_the_ledger_has_a_part_and_the_guard_owns_it():
    assert {s.name for s in topology.SERVICES if s.shares_ledger} == {roles.OWNER, *roles.PARTS}
    assert roles.OWNER not in roles.PARTS


def test_each_login_is_stripped_then_given_its_part_and_nothing_is_left_to_public():
    said = roles.statements(ALL, roles.PREFIX)
    assert "REVOKE ALL ON alembic_version, turns, approvals, conversations, conversation_turns FROM PUBLIC" in said
    assert of(said, "roundtrip_executor")[1:] == [
        "REVOKE ALL ON ALL TABLES IN SCHEMA public FROM roundtrip_executor",
        "REVOKE CREATE ON SCHEMA public FROM roundtrip_executor",
        "GRANT SELECT ON alembic_version, turns TO roundtrip_executor",
        "GRANT UPDATE (lease_step, lease_until, acted) ON turns TO roundtrip_executor",
    ]
    assert of(said, "roundtrip_console")[-1] == (
        "GRANT SELECT ON alembic_version, turns, approvals, conversations, conversation_turns TO roundtrip_console"
    )
    for reader in ("gate", "gateway"):
        assert of(said, f"roundtrip_{reader}")[-1] == f"GRANT SELECT ON alembic_version, turns TO roundtrip_{reader}"
    grants = [s for s in said if s.startswith("GRANT")]
    assert not [g for g in grants if re.search(r"\b(INSERT|DELETE|TRUNCATE|ALL|CREATE)\b", g)], grants
    assert not of(said, "roundtrip_guard")  # the owner: whoever migrated the tables


def test_the_model_service_keeps_its_batch_calls_and_only_the_console_reads_them():
    said = roles.statements([*ALL, "model_batch_calls"], roles.PREFIX)
    assert of(said, "roundtrip_model")[-2:] == [
        "GRANT UPDATE (lease_until, status, last_progress_at, flagged_at) ON turns TO roundtrip_model",
        "GRANT INSERT, UPDATE, DELETE ON model_batch_calls TO roundtrip_model",
    ]
    assert "GRANT SELECT ON alembic_version, turns, model_batch_calls TO roundtrip_model" in said
    granted = [s for s in said if s.startswith("GRANT") and "model_batch_calls" in s]
    assert [s.split(" TO ")[1] for s in granted] == ["roundtrip_console", "roundtrip_model", "roundtrip_model"]
    assert roles.PARTS["model"].may("DELETE", "model_batch_calls") and not roles.PARTS["model"].may("DELETE", "turns")
    assert not roles.PARTS["console"].may("UPDATE", "model_batch_calls")


def test_only_the_tables_of_the_database_are_granted_and_the_prefix_names_the_logins():
    said = roles.statements(["conversations", "conversation_turns"], prefix="acme_")
    assert "GRANT SELECT ON alembic_version TO acme_executor" in said  # no turns here: nothing to claim
    assert not [s for s in said if "UPDATE" in s]
    assert "GRANT SELECT ON alembic_version, conversations, conversation_turns TO acme_console" in said
    assert [s for s in said if "CREATE ROLE" in s] == [
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'acme_{s}') THEN "
        f"CREATE ROLE acme_{s} LOGIN; END IF; END $$"
        for s in roles.PARTS
    ]


def test_a_password_is_only_in_what_is_applied_and_quoted():
    assert roles.creation("roundtrip_model", "it's:%s") == "CREATE ROLE roundtrip_model LOGIN PASSWORD 'it''s:%s'"
    assert "PASSWORD" not in roles.creation("roundtrip_model")
    assert roles.password_of("postgresql+asyncpg://roundtrip_gate:s3cret@db/ledger", "roundtrip_gate") == "s3cret"
    assert roles.password_of("s3cret", "roundtrip_gate") == "s3cret"
    with pytest.raises(ValueError, match="not roundtrip_gate's") as wrong:
        roles.password_of("postgresql+asyncpg://roundtrip_guard:s3cret@db/ledger", "roundtrip_gate")
    assert "s3cret" not in str(wrong.value)


def test_the_refusal_is_one_line_naming_the_login_and_the_grant_to_remove():
    excess = roles.Excess(
        "roundtrip_executor", "may INSERT into turns", "REVOKE INSERT ON turns FROM roundtrip_executor"
    )
    assert excess.refusal("executor") == (
        "executor refuses to start: its database login roundtrip_executor may INSERT into turns; "
        "REVOKE INSERT ON turns FROM roundtrip_executor (roundtrip db roles prints the grants)"
    )


async def test_the_columns_granted_are_the_ones_the_claims_write(tmp_path):
    """Every genuine claim runs (on SQLite, recording each UPDATE): the columns it SETs are exactly its part."""
    fence = await Fence.open(await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"))
    written: list[str] = []

    @event.listens_for(fence.engine, "before_cursor_execute")
    def record(conn, cursor, statement, *args):
        if statement.startswith("UPDATE turns SET"):
            written.extend(re.findall(r"(\w+)=", statement.split(" WHERE ")[0]))

    turn = SimpleNamespace(turn_id="t_1", customer_id="cus_1", conversation_id="conv_1")
    row = dict(request_id="r", conversation_id="conv_1", customer_id="cus_1", step=1, turn_json="{}")
    now = time.time()

    async def start(status: str) -> None:
        statement = insert(turns).prefix_with("OR REPLACE")
        values = {**row, "turn_id": "t_1", "status": status, "started_at": now, "last_progress_at": now}
        await fence._run(lambda conn: conn.execute(statement.values(**values)), write=True)

    try:
        await start(RUNNING)
        assert await fence.claim_batch(turn, 1, lease_s=30, now=time.time())
        await fence.record_acted("t_1", 1, "{}\n")
        executor, written[:] = set(written), []
        assert await fence.claim_model_call(turn, 1, now=time.time())
        assert await fence.wait_for_capacity(turn, 1, now=time.time())
        await start(ENDING)
        assert not await fence.claim_model_call(
            turn, 1, now=time.time()
        )  # refused: releases the lease an end waits for
        model = set(written)
    finally:
        await fence.close()
    assert executor == set(roles.PARTS["executor"].updates["turns"])
    assert model == set(roles.PARTS["model"].updates["turns"])
