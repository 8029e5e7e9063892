"""The agent versions side by side on PostgreSQL (the unit tests read SQLite: tests/unit/test_version_outcomes.py): the
per-version read (one grouped read, the median by window functions), its sums as numbers whatever type PostgreSQL
sums a count in, the version filter of the turns and a drain's count of running turns, on a database of its own."""

from __future__ import annotations

from roundtrip._kernel.storage.ledger_reads import TurnReads
from roundtrip._kernel.storage.versions import Versions
from tests.databases import migrated
from tests.unit.test_version_outcomes import DEFAULT_IDS, EXPECTED, TURNS, V2_IDS, seeded


async def test_each_versions_figures_read_on_postgresql_as_on_sqlite(postgres_database):
    url = await migrated(postgres_database)
    await seeded(url)
    reads, store = await TurnReads.open(url, read_only=True), await Versions.open(url, read_only=True)
    try:
        rows = await reads.versions()
        summary = await store.summary()
        by = {v: sorted(r.turn_id for r in await reads.list(version=v, limit=100)) for v in ("v2", "", "v3")}
        every = await reads.list(limit=100)
        running = [await store.running(v) for v in ("", "v2", "v3")]
    finally:
        await reads.close()
        await store.close()
    assert {r.version: r.cells() for r in rows} == EXPECTED
    assert [(r.version, r.draining) for r in summary] == [("", False), ("v2", False), ("v3", True)]
    default, v2 = rows[0], rows[1]
    assert (default.steps, default.approvals, default.p50_s) == (12, 2, 10.0)
    assert (v2.steps, v2.approvals, v2.p50_s) == (8, 1, 4.0)
    assert all(type(r.steps) is int and type(r.approvals) is int for r in rows)  # not Decimal: numeric sums
    assert by == {"v2": V2_IDS, "": DEFAULT_IDS, "v3": []} and len(every) == len(TURNS)
    assert running == [1, 1, 0]
