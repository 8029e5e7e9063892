"""Batch lane benchmark: what a turn costs in the batch lane against the interactive one, on the same turns, and
what batch turns beside them do to the interactive turns' latency.

One fleet (embedded Kafka, the simulator at --latency-ms with its Message Batches ending --batch-delay-ms after
their creation, shop, the five services; the lane gathering calls for --max-wait-s and looking at open batches
every --poll-s), then two phases of the same turns (careful persona, "where is my order?", three model calls each):

  alone    --interactive turns, --concurrency at a time
  beside   the same interactive turns while --batch turns run in the batch lane, all asked at once

It prints the interactive turns' p50/p99 in each phase and their ratio (the issue's bar: within 10 %), the batch
turns' p50/p99 and outcomes, and the cost per turn of each lane from the replies (the guard prices a call that names
its batch at the batch rate) with their ratio (expected: about half). Figures go to docs/benchmarks.md by hand.

    .venv/bin/python -m tests.benchmarks.bench_batch [--batch-turns 1000] [--interactive 100] [--concurrency 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from roundtrip._fleet.launcher import Fleet
from tests.benchmarks.bench_loop import CUSTOMERS, PERSONA, TEXT, bench_settings, closed_loop
from tests.benchmarks.fleet_driver import FleetDriver
from tests.benchmarks.inprocess import TurnTiming
from tests.benchmarks.profiling import percentile


def figures(timings: list[TurnTiming]) -> dict:
    done = [t for t in timings if t.outcome == "end_turn"]
    latencies = [t.latency for t in done]
    return {
        "turns": len(timings),
        "outcomes": dict(Counter(t.outcome for t in timings)),
        "p50_s": percentile(latencies, 0.5),
        "p99_s": percentile(latencies, 0.99),
        "cost_per_turn_usd": sum(t.cost_usd for t in done) / len(done) if done else float("nan"),
    }


async def interactive(driver: FleetDriver, args: argparse.Namespace) -> dict:
    async def turn(i: int) -> TurnTiming:
        return await driver.turn(TEXT, CUSTOMERS[i % len(CUSTOMERS)], PERSONA, timeout=args.timeout)

    timings, _ = await closed_loop(turn, args.concurrency, args.interactive, args.timeout * 10)
    return figures(timings)


async def measure(settings, args: argparse.Namespace, say) -> dict:
    driver = FleetDriver(settings, timeout=args.timeout)
    await driver.start()
    try:
        say(f"warm-up: {args.concurrency} interactive turns")
        await interactive(driver, argparse.Namespace(**{**vars(args), "interactive": args.concurrency}))
        say(f"alone: {args.interactive} interactive turns, {args.concurrency} at a time")
        alone = await interactive(driver, args)
        say(f"beside: the same beside {args.batch} batch turns asked at once")
        started = time.perf_counter()
        batch = [
            asyncio.create_task(
                driver.turn(TEXT, CUSTOMERS[i % len(CUSTOMERS)], PERSONA, timeout=args.batch_timeout, lane="batch")
            )
            for i in range(args.batch)
        ]
        beside = await interactive(driver, args)
        batch_figures = figures(list(await asyncio.gather(*batch)))
        batch_figures["all_answered_s"] = time.perf_counter() - started
    finally:
        await driver.stop()
    return {"alone": alone, "beside": beside, "batch": batch_figures}


def report(results: dict, args: argparse.Namespace) -> str:
    alone, beside, batch = results["alone"], results["beside"], results["batch"]
    lines = [
        f"{os.cpu_count()} cores; simulator latency {args.latency_ms:g} ms, batches end after "
        f"{args.batch_delay_ms:g} ms; lane: max wait {args.max_wait_s:g} s, poll {args.poll_s:g} s",
        "",
        "| turns | n | outcomes | p50 s | p99 s | cost per turn |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, f in (("interactive alone", alone), ("interactive beside batch", beside), ("batch lane", batch)):
        lines.append(
            f"| {name} | {f['turns']} | {f['outcomes']} | {f['p50_s']:.2f} | {f['p99_s']:.2f} | "
            f"${f['cost_per_turn_usd']:.5f} |"
        )
    lines += [
        "",
        f"interactive p50 beside batch turns / alone: {beside['p50_s'] / alone['p50_s']:.2f}x "
        f"(p99 {beside['p99_s'] / alone['p99_s']:.2f}x)",
        f"cost per turn, batch lane / interactive: {batch['cost_per_turn_usd'] / alone['cost_per_turn_usd']:.2f}",
        f"every batch turn answered {batch['all_answered_s']:.1f} s after they were asked",
    ]
    return "\n".join(lines)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--batch-turns", "--batch", dest="batch", type=int, default=1000, help="batch turns beside the interactive ones"
    )
    parser.add_argument("--interactive", type=int, default=100, help="interactive turns per phase (100)")
    parser.add_argument("--concurrency", type=int, default=100, help="interactive turns at a time (100)")
    parser.add_argument("--latency-ms", type=float, default=1000.0, help="the simulator's latency per call (1000)")
    parser.add_argument("--batch-delay-ms", type=float, default=20000.0, help="how long a batch stays open (20000)")
    parser.add_argument("--max-wait-s", type=float, default=5.0, help="ROUNDTRIP_BATCH_MAX_WAIT_S (5)")
    parser.add_argument("--poll-s", type=float, default=5.0, help="ROUNDTRIP_BATCH_POLL_S and its cap (5)")
    parser.add_argument("--timeout", type=float, default=120.0, help="an interactive turn's timeout (120 s)")
    parser.add_argument("--batch-timeout", type=float, default=3600.0, help="a batch turn's timeout (3600 s)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    say = lambda text: print(text, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="roundtrip-batch-") as state:
        settings, env = bench_settings(Path(state), 6, args.latency_ms, 0.3, max(200, args.concurrency))
        lane = {
            "ROUNDTRIP_SIMULATOR_BATCH_DELAY_MS": str(args.batch_delay_ms),
            "ROUNDTRIP_BATCH_MAX_WAIT_S": str(args.max_wait_s),
            "ROUNDTRIP_BATCH_POLL_S": str(args.poll_s),
            "ROUNDTRIP_BATCH_POLL_MAX_S": str(args.poll_s),
            "ROUNDTRIP_BATCH_MAX_CALLS": "1000",
            "ROUNDTRIP_STUCK_AFTER_S": str(max(60.0, 4 * args.batch_delay_ms / 1000)),
        }
        env |= lane
        os.environ.update(lane)
        fleet = Fleet(settings, env=env, say=say)
        try:
            fleet.start()
            results = asyncio.run(measure(settings, args, say))
        finally:
            fleet.stop()
    say("")
    say(report(results, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
