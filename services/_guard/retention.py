"""Retention of ended turns: deleted, with their approvals and side-effect records, ROUNDTRIP_LEDGER_RETENTION_S after
their end, so the table every start, claim and advance touches stays the size of its window.

* **Bounded batches, oldest first, by an index** (`ix_turns_ended_at`, migration ledger_0005): each batch is one
  short transaction that selects at most BATCH ended turns past the retention and deletes them and their approvals.
  On PostgreSQL the selection takes its rows `FOR UPDATE SKIP LOCKED`, so a batch never waits for a row the hot path
  holds (nor two guard replicas for each other); the hot path's rows are live turns, which no batch touches. Between
  batches the task yields for PAUSE_S; at most MAX_BATCHES per pass, a pass every sweep interval, so a backlog (the
  first pass on an old ledger) is worked off at a bounded pace instead of in one long statement.
* **SQLite**: the same batches. A deleted row's pages go to the file's free list and the next inserts reuse them, so
  at a steady rate the file stays at the size of the retention window; the WAL is truncated to JOURNAL_LIMIT_BYTES
  after its checkpoints (services/_kernel/storage/database.py), so it does not keep the size of its largest burst.
* **Dedupe outlives it.** A request delivered again from the requests topic is recognised by its turn row; once the
  row is gone it would start a second turn. So the retention must be longer than the topic's `retention.ms`: the
  guard refuses to start when it is not (`check_outlasts`), and says so when it cannot read the topic's setting.
* **Its size is shown**: `roundtrip turns` prints the ledger's rows and its oldest ended turn; the guard sets
  `roundtrip_ledger_rows` and `roundtrip_ledger_oldest_ended_seconds` every SIZE_EVERY_S and counts
  `roundtrip_ledger_deleted_total`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import String, any_, bindparam, delete, func, select, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncEngine

from roundtrip._kernel.kafka import faults
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.settings.checks import ConfigurationError
from roundtrip._kernel.storage.turnstore import ENDED, TurnStore, approvals, turns

log = logging.getLogger("roundtrip.guard")

BATCH = 500  # turns per delete transaction (well inside SQLite's limit of bound parameters)
PAUSE_S = 0.02  # between two batches: the hot path's statements go first
MAX_BATCHES = 10  # per pass: up to 5,000 turns every sweep interval (4,000 turns/s at 1.25 s), several passes a backlog
SIZE_EVERY_S = 60.0

_OLDEST = select(func.min(turns.c.ended_at))
_COUNT = select(func.count()).select_from(turns)
_ESTIMATE = text("SELECT reltuples::bigint FROM pg_class WHERE relname = 'turns'")


def _among_ids(column: Any, postgres: bool) -> Any:
    """`column` is one of the batch's ids, bound as `b_ids`."""
    if postgres:
        return column == any_(bindparam("b_ids", type_=ARRAY(String)))
    return column.in_(bindparam("b_ids", expanding=True))


class RetentionTooShort(ConfigurationError):
    """ROUNDTRIP_LEDGER_RETENTION_S shorter than the requests topic's retention.ms: dedupe would not hold."""


@dataclass
class LedgerSize:
    rows: int  # PostgreSQL: the planner's estimate (exact after VACUUM/ANALYZE); SQLite: counted
    oldest_ended_at: float | None
    estimated: bool = False

    def line(self, retention_s: float, now: float | None = None) -> str:
        now = now or time.time()
        oldest = (
            f"oldest ended turn {_duration(now - self.oldest_ended_at)} ago"
            if self.oldest_ended_at is not None
            else "no ended turn"
        )
        rows = f"~{self.rows}" if self.estimated else str(self.rows)
        return f"ledger: {rows} turns, {oldest} (ended turns are kept {_duration(retention_s)})"


class Retention:
    def __init__(self, store: TurnStore, retention_s: float, batch: int = BATCH, max_batches: int = MAX_BATCHES):
        self.store, self.retention_s, self.batch, self.max_batches = store, retention_s, batch, max_batches
        self._postgres = isinstance(store.engine, AsyncEngine)
        doomed = (
            select(turns.c.turn_id)
            .where(turns.c.status == ENDED, turns.c.ended_at < bindparam("b_before"))
            .order_by(turns.c.ended_at)
            .limit(batch)
        )
        self._doomed = doomed.with_for_update(skip_locked=True) if self._postgres else doomed
        # the batch's ids as one array on PostgreSQL (`= ANY($1)`): an IN list of n placeholders is new SQL for each
        # n, and asyncpg prepares (and keeps, on every pooled connection) a statement per SQL text, which the soak
        # showed as the guard's memory growing with every batch of another size
        self._delete_approvals = delete(approvals).where(_among_ids(approvals.c.turn_id, self._postgres))
        self._delete_turns = delete(turns).where(_among_ids(turns.c.turn_id, self._postgres), turns.c.status == ENDED)

    async def sweep(self, now: float | None = None) -> int:
        """One pass: delete the turns ended before now - retention, in batches, at most max_batches; how many."""
        before = (now or time.time()) - self.retention_s
        deleted = 0
        for n in range(self.max_batches):
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
        """The ledger's rows and its oldest ended turn (cheap: an estimate and an index's first entry on PostgreSQL)."""

        def read(conn: Any) -> LedgerSize:
            oldest = conn.execute(_OLDEST).scalar_one()
            if self._postgres and (estimate := conn.execute(_ESTIMATE).scalar()) is not None and estimate >= 0:
                return LedgerSize(int(estimate), oldest, estimated=True)
            return LedgerSize(int(conn.execute(_COUNT).scalar_one()), oldest)

        return await self.store._run(read)

    async def measure(self, now: float | None = None) -> LedgerSize:
        size = await self.size()
        metrics.ledger_rows.set(size.rows)
        age = 0.0 if size.oldest_ended_at is None else max(0.0, (now or time.time()) - size.oldest_ended_at)
        metrics.ledger_oldest_ended.set(age)
        return size


async def run(retention: Retention, interval_s: float) -> None:
    """A pass every interval_s and the ledger's size every SIZE_EVERY_S, for ever (cancel to stop); a pass that fails
    (the database away) is retried at the next tick, said once per outage."""
    measured_at, away = -SIZE_EVERY_S, False
    while True:
        try:
            if deleted := await retention.sweep():
                log.info("deleted %d turns ended more than %s ago", deleted, _duration(retention.retention_s))
            if time.monotonic() - measured_at >= SIZE_EVERY_S:
                measured_at = time.monotonic()
                await retention.measure()
            away = False
        except Exception as exc:  # the retention must outlive a database hiccup
            if faults.unavailable(exc) is None:
                log.exception("deleting ended turns failed; will retry")
            elif not away:
                away = True
                log.warning("deleting ended turns paused: the database is unavailable (%s)", exc)
        await asyncio.sleep(interval_s)


async def requests_retention_ms(settings: Settings) -> int | None:
    """The requests topic's retention.ms as the broker says it (-1: for ever); None when it cannot be read."""
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
    except KafkaConnectionError as exc:  # no broker: the service's own start says so, in one line
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
        kept = "for ever" if topic_retention_ms < 0 else _duration(topic_retention_ms / 1000)
        raise RetentionTooShort(
            f"guard refuses to start: ROUNDTRIP_LEDGER_RETENTION_S ({_duration(retention_s)}) is shorter than the "
            f"requests topic keeps its requests ({kept}, retention.ms), so a request delivered again after its turn "
            "was deleted would be answered twice; set it longer than the topic's retention.ms"
        )


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}".replace(".0 ", " ")
    return f"{seconds:.0f} s"
