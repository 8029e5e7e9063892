"""Retention of ended turns (services/_guard/retention.py) on both databases: ended turns past their
retention (ROUNDTRIP_LEDGER_RETENTION_S) are deleted with their approvals, the rest kept (a request delivered again
within the retention is recognised), 100,000 ended turns are deleted in batches while the hot path (start, claim,
advance) keeps completing, a SQLite file reuses what was deleted, and the guard refuses a retention shorter than the
requests topic's retention.ms."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from types import SimpleNamespace

import pytest
from sqlalchemy import func, insert, select, text

from roundtrip._guard import retention as retention_module
from roundtrip._guard.ledger import ENDED, Ledger
from roundtrip._guard.retention import Retention, RetentionTooShort, check_outlasts
from roundtrip._kernel.storage.turnstore import Fence, approvals, turns
from tests.databases import migrated, new_database
from tests.ledger_steps import advance
from tests.signing import key_environment

DAY = 86400.0
RETENTION_S = 14 * DAY


@pytest.fixture(params=["sqlite", "postgres"])
def database(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    return new_database(request.getfixturevalue("postgres_url"))  # a database of its own on the session's server


def turn(turn_id: str) -> dict:
    return {"turn_id": turn_id, "request_id": f"r_{turn_id}", "conversation_id": f"c_{turn_id}", "customer_id": "cus_1"}


def ended_row(turn_id: str, ended_at: float) -> dict:
    return dict(
        turn_id=turn_id, request_id=f"r_{turn_id}", conversation_id=f"c_{turn_id}", customer_id="cus_1",
        status=ENDED, step=2, started_at=ended_at - 5, last_progress_at=ended_at, ended_at=ended_at, outcome="end_turn",
        input_tokens=100, output_tokens=20, cache_creation_input_tokens=0, cache_read_input_tokens=0, cost_usd=0.001,
        trace_id="0" * 32, turn_json=f'{{"turn_id": "{turn_id}"}}', pending=None,
        acted='{"tool": "cancel_order", "order_id": "ord_00000001"}\n',
    )  # fmt: skip


def approval_row(turn_id: str, at: float) -> dict:
    return dict(
        approval_id=f"appr_{turn_id}", turn_id=turn_id, step=1, tool_use_id="toolu_1", tool="cancel_order",
        input_sha256="0" * 64, customer_id="cus_1", conversation_id=f"c_{turn_id}", status="approved", reason="r",
        requested_at=at, expires_at=at + 60, request_json="{}",
    )  # fmt: skip


async def bulk(ledger: Ledger, table, rows: list[dict], chunk: int = 5000) -> None:
    for i in range(0, len(rows), chunk):
        await ledger._run(lambda conn, part=rows[i : i + chunk]: conn.execute(insert(table), part), write=True)


async def count(ledger: Ledger, table) -> int:
    return await ledger._run(lambda conn: conn.execute(select(func.count()).select_from(table)).scalar_one())


async def test_ended_turns_past_the_retention_go_with_their_approvals_and_the_rest_still_dedupes(database):
    ledger = await Ledger.open(await migrated(database))
    try:
        now = time.time()
        old, recent = now - RETENTION_S - 3600, now - RETENTION_S + 3600
        for t, at in (("t_old1", old), ("t_old2", old), ("t_recent", recent)):  # ended through the real path
            assert await ledger.start(turn(t), pending="{}", now=at, outcome="end_turn")
        await bulk(ledger, approvals, [approval_row("t_old1", old), approval_row("t_recent", recent)])
        assert await ledger.start(turn("t_live"), pending="{}", now=old)  # started long ago, still running: kept
        retention = Retention(ledger, RETENTION_S)
        assert await retention.sweep(now) == 2
        assert await ledger.get("t_old1") is None and await ledger.get("t_old2") is None
        assert await ledger.approval("appr_t_old1") is None and await ledger.approval("appr_t_recent") is not None
        assert (await ledger.get("t_recent")).status == ENDED and (await ledger.get("t_live")).status == "running"
        # dedupe still holds within the retention: the same request delivered again starts no second turn
        assert not await ledger.start(turn("t_recent"), pending="{}")
        assert await retention.sweep(now) == 0  # nothing more to delete
        postgres = database.startswith("postgresql")
        if postgres:  # PostgreSQL's estimate is the planner's statistics: fresh once the table is analyzed
            await ledger._run(lambda conn: conn.execute(text("ANALYZE turns")), write=True)
        size = await retention.size()
        assert size.oldest_ended_at == pytest.approx(recent)
        assert (size.rows, size.estimated) == (2, postgres)  # t_recent and t_live
        assert "oldest ended turn 14 d ago" in size.line(RETENTION_S, now)
    finally:
        await ledger.close()


async def test_100000_ended_turns_are_deleted_in_batches_while_the_hot_path_keeps_completing(
    database, capsys, monkeypatch
):
    url = await migrated(database)
    ledger, fence = await Ledger.open(url), await Fence.open(url)
    try:
        now = time.time()
        n = 100_000
        await bulk(ledger, turns, [ended_row(f"t{i:06d}", now - RETENTION_S - DAY + i * 0.01) for i in range(n)])
        before = [await _hot_step(ledger, fence, f"warm{i}") for i in range(50)]
        monkeypatch.setattr(retention_module, "MAX_BATCHES", 10**6)  # one pass deletes everything
        retention = Retention(ledger, RETENTION_S)
        sweep = asyncio.create_task(retention.sweep(now))
        during: list[float] = []
        started = time.perf_counter()
        while not sweep.done():
            during.append(await _hot_step(ledger, fence, f"hot{len(during)}"))
            await asyncio.sleep(0)  # a service yields between messages (SQLite's statements run inline, never yielding)
        deleted, took = await sweep, time.perf_counter() - started
        assert deleted == n
        assert await count(ledger, turns) == 50 + len(during)  # only the hot path's own turns are left
        # the hot path was not held off by the delete: it kept completing steps the whole time, on every batch
        assert len(during) >= deleted // retention.batch // 4, (len(during), deleted // retention.batch)
        with capsys.disabled():
            print(
                f"\n[bench] retention on {url.split(':')[0]}: {n} ended turns deleted in {took:.1f} s "
                f"({n / took:.0f}/s, {retention.batch} a batch); hot-path step (start+claim+advance) p50/p99 "
                f"before {_ms(before, 50)}/{_ms(before, 99)} ms, during {_ms(during, 50)}/{_ms(during, 99)} ms "
                f"({len(during)} steps during the delete)",
                flush=True,
            )
    finally:
        await ledger.close()
        await fence.close()


async def _hot_step(ledger: Ledger, fence: Fence, turn_id: str) -> float:
    started = time.perf_counter()
    assert await ledger.start(turn(turn_id), pending="{}")
    assert await fence.claim_batch(SimpleNamespace(**turn(turn_id)), 0, lease_s=30, now=time.time())
    assert await advance(ledger, SimpleNamespace(**turn(turn_id)), 1, {}, 0.0, pending="{}", now=time.time())
    return time.perf_counter() - started


def _ms(samples: list[float], q: int) -> str:
    if len(samples) < 2:
        return "-"
    return f"{statistics.quantiles(samples, n=100)[q - 1] * 1000:.1f}" if q < 100 else "-"


async def test_a_sqlite_ledger_reuses_the_space_of_what_it_deleted(tmp_path, monkeypatch):
    path = tmp_path / "ledger.db"
    url = await migrated(f"sqlite+aiosqlite:///{path}")
    ledger = await Ledger.open(url)
    try:
        now, n = time.time(), 20_000
        monkeypatch.setattr(retention_module, "MAX_BATCHES", 10**6)
        retention = Retention(ledger, RETENTION_S)
        sizes = []
        for cycle in range(3):  # a window's worth written, then deleted by the retention, three times over
            rows = [ended_row(f"c{cycle}t{i:06d}", now - RETENTION_S - DAY) for i in range(n)]
            await bulk(ledger, turns, rows)
            assert await retention.sweep(now) == n
            await ledger._run(lambda conn: conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)"))
            sizes.append(os.path.getsize(path))
        assert sizes[2] <= sizes[0] * 1.1, sizes  # the file does not grow cycle after cycle: its free pages are reused
    finally:
        await ledger.close()


def test_the_guard_refuses_a_retention_shorter_than_the_requests_topics():
    check_outlasts(14 * DAY, 7 * DAY * 1000)  # Kafka's default retention (7 days) under the default (14 days): fine
    check_outlasts(60, None)  # the topic's setting could not be read: not checked (the guard says so)
    with pytest.raises(RetentionTooShort) as refused:
        check_outlasts(3 * DAY, 7 * DAY * 1000)
    line = str(refused.value)
    assert "\n" not in line and "ROUNDTRIP_LEDGER_RETENTION_S (3 d)" in line and "(7 d, retention.ms)" in line
    with pytest.raises(RetentionTooShort, match="for ever"):
        check_outlasts(30 * DAY, -1)


async def test_the_guard_reads_the_requests_topics_retention_from_the_broker(kafka_bootstrap, kafka_topics):
    from roundtrip._guard.retention import requests_retention_ms
    from roundtrip._kernel.settings import Settings

    settings = Settings(_env_file=None, kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=kafka_topics)
    kept = await requests_retention_ms(settings)
    assert kept is not None and kept > 0  # the broker's default (7 days) unless the topic says otherwise
    with pytest.raises(RetentionTooShort):
        check_outlasts(kept / 1000 - 1, kept)
    gone = Settings(_env_file=None, kafka_bootstrap_servers=kafka_bootstrap, topic_prefix="nosuchfleet.")
    assert await requests_retention_ms(gone) is None  # not there: not checked, said in a warning


async def test_roundtrip_run_guard_refuses_a_short_retention_in_one_line(kafka_bootstrap, kafka_topics, tmp_path):
    import subprocess
    import sys

    url = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")} | {
        "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "ROUNDTRIP_TOPIC_PREFIX": kafka_topics,
        "ROUNDTRIP_LEDGER_DATABASE_URL": url,
        "ROUNDTRIP_STATE_DIR": str(tmp_path),
        "ROUNDTRIP_LEDGER_RETENTION_S": "3600",  # an hour, under the broker's default 7 days
        **key_environment(),  # not development: keys of its own, so the retention is what it refuses
        "ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT": "true",  # the test broker listens in the clear; this is not development
    }
    ran = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "roundtrip._cli.main", "run", "guard"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 1, ran.stdout + ran.stderr
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "guard refuses to start: ROUNDTRIP_LEDGER_RETENTION_S (1 h)" in errors[0], ran.stderr
    assert "Traceback" not in ran.stderr
