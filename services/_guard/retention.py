"""Retention of ended turns: deleted with their approvals ROUNDTRIP_LEDGER_RETENTION_S after their end.

Short batches, oldest first by `ix_turns_ended_at`, a bounded number a pass, so a backlog never becomes one long
statement; on PostgreSQL `FOR UPDATE SKIP LOCKED`, so a batch never waits for a row the hot path holds. Dedupe relies
on the turn row: the retention must outlast the requests topic's `retention.ms`, or the guard refuses to start
(`check_outlasts`). The design and its figures: docs/faults.md, "Retention of ended turns".
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

from sqlalchemy import String, any_, bindparam, delete, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncEngine

from roundtrip._kernel.kafka import faults
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.settings.checks import ConfigurationError
from roundtrip._kernel.storage.ledger_reads import LedgerSize, TurnReads, duration
from roundtrip._kernel.storage.turnstore import ENDED, approvals, turns

log = logging.getLogger("roundtrip.guard")

BATCH = 500  # turns per delete transaction (well inside SQLite's limit of bound parameters)
PAUSE_S = 0.02  # between two batches: the hot path's statements go first
MAX_BATCHES = 10  # per pass
SIZE_EVERY_S = 60.0


def _among_ids(column: Any, postgres: bool) -> Any:
    if postgres:
        return column == any_(bindparam("b_ids", type_=ARRAY(String)))
    return column.in_(bindparam("b_ids", expanding=True))


class RetentionTooShort(ConfigurationError):
    """ROUNDTRIP_LEDGER_RETENTION_S shorter than the requests topic's retention.ms: dedupe would not hold."""


class Retention:
    def __init__(self, store: TurnReads, retention_s: float):
        self.store, self.retention_s, self.batch = store, retention_s, BATCH
        self._postgres = isinstance(store.engine, AsyncEngine)
        doomed = (
            select(turns.c.turn_id)
            .where(turns.c.status == ENDED, turns.c.ended_at < bindparam("b_before"))
            .order_by(turns.c.ended_at)
            .limit(BATCH)
        )
        self._doomed = doomed.with_for_update(skip_locked=True) if self._postgres else doomed
        # one array on PostgreSQL (`= ANY($1)`): asyncpg keeps a prepared statement per SQL text and connection,
        # and an IN list of n placeholders is new SQL for each n
        self._delete_approvals = delete(approvals).where(_among_ids(approvals.c.turn_id, self._postgres))
        self._delete_turns = delete(turns).where(_among_ids(turns.c.turn_id, self._postgres), turns.c.status == ENDED)

    async def sweep(self, now: float) -> int:
        before = now - self.retention_s
        deleted = 0
        for n in range(MAX_BATCHES):
            if n:
                await asyncio.sleep(PAUSE_S)
            done = await self.store._run(lambda conn: self._delete_batch(conn, before), write=True)
            deleted += done
            if done < self.batch:
                break
        if deleted:
            metrics.ledger_deleted.inc(deleted)
        return deleted

    def _delete_batch(self, conn: Any, before: float) -> int:
        ids = conn.execute(self._doomed, {"b_before": before}).scalars().all()
        if not ids:
            return 0
        conn.execute(self._delete_approvals, {"b_ids": list(ids)})
        return cast(int, conn.execute(self._delete_turns, {"b_ids": list(ids)}).rowcount)

    async def size(self) -> LedgerSize:
        return await self.store.size()

    async def measure(self, now: float) -> LedgerSize:
        size = await self.size()
        metrics.ledger_rows.set(size.rows)
        metrics.ledger_oldest_ended.set(0.0 if size.oldest_ended_at is None else max(0.0, now - size.oldest_ended_at))
        waiting, oldest = await self.store.approvals_waiting()
        metrics.approvals_waiting.set(waiting)
        metrics.approval_oldest_wait.set(0.0 if oldest is None else max(0.0, now - oldest))
        return size


async def run(retention: Retention, interval_s: float) -> None:
    """A pass every interval_s and the ledger's size every SIZE_EVERY_S, for ever; a failed pass waits for the next."""
    measured_at, away = -SIZE_EVERY_S, False
    while True:
        try:
            if deleted := await retention.sweep(time.time()):
                log.info("deleted %d turns ended more than %s ago", deleted, duration(retention.retention_s))
            if time.monotonic() - measured_at >= SIZE_EVERY_S:
                measured_at = time.monotonic()
                await retention.measure(time.time())
            away = False
        except Exception as exc:  # the retention must outlive a database hiccup
            if faults.unavailable(exc) is None:
                log.exception("deleting ended turns failed; will retry")
            elif not away:
                away = True
                log.warning("deleting ended turns paused: the database is unavailable (%s)", exc)
        await asyncio.sleep(interval_s)


async def requests_retention_ms(settings: Settings) -> int | None:
    """The requests topic's retention.ms (-1: for ever); None when it cannot be read."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
    from aiokafka.errors import KafkaConnectionError

    from roundtrip._kernel.kafka.admin import _admin
    from roundtrip._kernel.kafka.clients import kafka_clients
    from roundtrip._kernel.wire import topics

    name = topics.t(topics.SUPPORT_REQUESTS, settings.topic_prefix)
    admin = _admin(kafka_clients(settings), request_timeout_ms=10000)
    try:
        await admin.start()
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
        for _code, _msg, _type, _name, entries in response.resources:
            for entry in entries:
                if entry[0] == "retention.ms" and entry[1] is not None:
                    return int(entry[1])
        return None
    except KafkaConnectionError as exc:  # the service's own start says so, in one line
        log.debug("cannot read retention.ms of %s: %s", name, exc)
        return None
    except Exception as exc:  # noqa: BLE001 - not allowed (ACLs) or not there: the guard says so and goes on
        log.warning("cannot read retention.ms of %s (%s: %s); the ledger's retention is not checked against it",
                    name, type(exc).__name__, exc)  # fmt: skip
        return None
    finally:
        await admin.close()


def check_outlasts(retention_s: float, topic_retention_ms: int | None) -> None:
    """Raise RetentionTooShort (one line) when ended turns would be deleted while their request can still be read."""
    if topic_retention_ms is None:
        return
    if topic_retention_ms < 0 or topic_retention_ms / 1000 > retention_s:
        kept = "for ever" if topic_retention_ms < 0 else duration(topic_retention_ms / 1000)
        raise RetentionTooShort(
            f"guard refuses to start: ROUNDTRIP_LEDGER_RETENTION_S ({duration(retention_s)}) is shorter than the "
            f"requests topic keeps its requests ({kept}, retention.ms), so a request delivered again after its turn "
            "was deleted would be answered twice; set it longer than the topic's retention.ms"
        )
