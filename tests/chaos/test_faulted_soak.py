"""The faulted soak's short profile (issue 52): tests/benchmarks/bench_faulted.py on PostgreSQL, a fault every two
minutes (each service SIGKILLed in turn, the executors mid-batch; the Messages API answering 529 for 60 s; the broker
SIGKILLed and restarted), held to the faulted hour's bounds: every request one reply, no side effect twice, nothing
dead-lettered but the poison (all of it intact), every fault injected and replies flowing within 30 s of its end.
The RSS slope is the hour's to judge: no process here lives past its 10-minute warm-up (the report says so).

Run: .venv/bin/python -m pytest -q tests/chaos/test_faulted_soak.py -s
"""

from __future__ import annotations

import pytest

from tests.benchmarks import bench_faulted, faulted_report
from tests.databases import find_pg_bindir

pytestmark = [pytest.mark.chaos, pytest.mark.postgres, pytest.mark.timeout(1080)]

FAULTS = ("services-kill", "overload", "broker-kill")
PROFILE = ["--minutes", "6", "--faults", "every:2m", "--only", ",".join(FAULTS), "--rate", "2", "--latency-ms", "300"]


def test_the_short_faulted_profile_keeps_the_faulted_hours_bounds(tmp_path, capsys):
    if find_pg_bindir() is None:
        pytest.fail("PostgreSQL server binaries not found (see tests/conftest.py's postgres_url)", pytrace=False)
    out = ["--report", str(tmp_path / "faulted.md"), "--plot", str(tmp_path / "faulted.png")]
    args = bench_faulted.parse([*PROFILE, "--sample-s", "30", *out])
    run, text, _ = bench_faulted.run_profile(args)
    with capsys.disabled():
        print("\n" + text, flush=True)
    assert [f.kind for f in run.injected] == list(FAULTS), "each fault of the profile should have landed, in turn"
    assert run.audit is not None and run.audit.side_effects > 0, "the load should have had side effects to duplicate"
    assert len(run.samples) >= 10, f"sampled every 30 s over 7 minutes and more: {len(run.samples)}"
    assert run.poison_sent and all(s.totals["scraped"] for s in run.samples[-3:]), "poison sent, /metrics scraped"
    assert faulted_report.broken(run, args) == []
