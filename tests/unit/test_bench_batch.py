"""The batch lane benchmark (tests/benchmarks/bench_batch.py) takes the issue's shape, 1,000 batch turns beside 100
concurrent interactive ones, by default or spelled out, and the smaller run docs/batch-lane.md reports."""

from __future__ import annotations

from tests.benchmarks import bench_batch


def test_the_benchmark_takes_the_issues_shape_by_default_or_spelled_out():
    for args in (bench_batch.arguments(["--batch-turns", "1000", "--interactive", "100"]), bench_batch.arguments([])):
        assert (args.batch, args.interactive, args.concurrency) == (1000, 100, 100)
    measured = bench_batch.arguments(["--batch", "200", "--interactive", "50", "--concurrency", "50"])
    assert (measured.batch, measured.interactive, measured.concurrency) == (200, 50, 50)
