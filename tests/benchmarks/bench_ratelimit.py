"""Rate-limit benchmark: the fleet on its defaults against a simulator that enforces the Messages API's limits.

One fleet (embedded Kafka, simulator at 1 s ± 30 %, shop, the five services), then phases of
`--seconds` each, 60 turns in flight (closed loop, careful persona, 3 model calls per turn):

  cold       600 requests a minute enforced over `--burst-s` seconds (1: the bucket holds 10 requests; the API may
             enforce a limit over intervals shorter than a minute), met by a cold fleet: it runs first, before the
             warm-up, so the model service's limiter has seen no answer yet (its slow start, capacity.py)
  rpm        600 requests a minute
  itpm       an input-token limit instead (`--itpm`, 15,000 a minute: about 7 calls a second of these turns)
  halved     600 requests a minute, then 300 from the middle of the phase (another app took half)
  replicas   600 requests a minute with 3 model-service replicas, each adapting alone
  inprocess  the same 600 against a plain in-process loop: the same turns and handlers, the anthropic SDK with its
             default retries (2, sleeping retry-after), no limiter, an APIError after them ending the turn
             model_error (tests/benchmarks/inprocess.py, plain=True)

Each phase starts with full buckets (the limits unset, then set), as a fleet meets them after a quiet minute:
a limiter that used a full bucket's minute of burst would show more successful calls than the limit, and one
that drained it would show the 429s that follow. Per phase:
turns by outcome, the share of calls answered 429 (the simulator's count), successful calls (or input tokens)
per second, how many of them the bucket's store paid for (its level at the start less at the end), the rest
against the limit's rate, turn p50/p99; then the phases side by side (turns end_turn / model_error / other, the share
of calls answered 429). Figures go to docs/benchmarks.md by hand.

    .venv/bin/python -m tests.benchmarks.bench_ratelimit [--phases cold,rpm,itpm,halved,replicas,inprocess] \
        [--seconds 90] [--burst-s 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

from roundtrip._fleet.launcher import Fleet
from tests.benchmarks.bench_loop import CUSTOMERS, PERSONA, TEXT, add_model_replicas, bench_settings, closed_loop
from tests.benchmarks.fleet_driver import FleetDriver
from tests.benchmarks.inprocess import InProcessLoop, TurnTiming

RPM = 600


def limits(base_url: str, **values: int | None) -> dict:
    """POST /v1/_limits (values) or GET it (none)."""
    url = f"{base_url.rstrip('/')}/v1/_limits"
    body = json.dumps(values).encode() if values else None
    request = urllib.request.Request(
        url, data=body, method="POST" if values else "GET", headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def set_full(base_url: str, **values: int | None) -> None:
    """These limits, with full buckets (unset first: a limit set anew starts full)."""
    limits(base_url, **dict.fromkeys(values))
    limits(base_url, **values)


def p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def summary(
    name: str,
    timings: list[TurnTiming],
    seconds: float,
    refused: int,
    per_s_limit: float,
    unit: str,
    window: tuple[float, float, float],
    counted: list[tuple[float, int]] = (),
) -> dict:
    """`window`: (its start and end on the perf_counter axis, what the bucket's store paid for in it: its level at the
    start less at the end, less what a lowered limit cut off). The window is the time turns were being started (60 in
    flight); the phase goes on until the last of them ends, with fewer and fewer in flight."""
    outcomes = Counter(t.outcome for t in timings)
    calls = sum(t.steps for t in timings)
    tokens = sum((t.usage.get("input_tokens", 0) + t.usage.get("cache_creation_input_tokens", 0)) for t in timings)
    start, end, burst = window
    if unit == "input tokens":  # each iteration's own usage, by its wall-clock time
        wall0 = time.time() - time.perf_counter()
        in_window = sum(n for at, n in counted if start <= at - wall0 <= end)
        per_call = tokens / calls if calls else 0.0
    else:
        in_window, per_call = sum(1 for t in timings for at in t.responses if start <= at <= end), 1.0
    latencies = [t.latency for t in timings if t.outcome == "end_turn"]
    return {
        "phase": name,
        "turns": len(timings),
        "outcomes": dict(outcomes),
        "calls": calls,
        "refused": refused,
        "refused_share": refused / max(1, calls + refused),
        "unit": unit,
        "limit_per_s": per_s_limit,
        "used_per_s": calls * per_call / seconds,
        "window_s": end - start,
        "burst": burst,
        "window_per_s": in_window / (end - start),
        "refill_share": (in_window - burst) / (end - start) / per_s_limit,
        "p50_s": p(latencies, 0.5),
        "p99_s": p(latencies, 0.99),
        "seconds": seconds,
    }


def line(s: dict) -> str:
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(s["outcomes"].items()))
    return (
        f"  {s['phase']:<10} {s['turns']} turns ({outcomes}); {s['calls']} calls, {s['refused']} 429s "
        f"({100 * s['refused_share']:.1f} %); while 60 were in flight ({s['window_s']:.0f} s) {s['window_per_s']:.1f} "
        f"{s['unit']}/s, {s['burst']:.0f} from the bucket's store, the rest {100 * s['refill_share']:.0f} % of the "
        "limit "
        f"({s['limit_per_s']:.1f}/s); whole phase {s['used_per_s']:.1f}/s in {s['seconds']:.0f} s; "
        f"turn p50 {s['p50_s']:.1f} s, p99 {s['p99_s']:.1f} s"
    )


def side_by_side(results: list[dict]) -> list[str]:
    """The phases' turns and 429 shares in one table: the fleet's phases beside the plain in-process loop."""
    rows = ["  phase      end_turn  model_error  other  429s among calls"]
    for s in results:
        outcomes = Counter(s["outcomes"])
        done, failed = outcomes.pop("end_turn", 0), outcomes.pop("model_error", 0)
        who = "plain loop" if s["phase"] == "inprocess" else "fleet"
        rows.append(
            f"  {s['phase']:<10} {done:>8}  {failed:>11}  {sum(outcomes.values()):>5}  "
            f"{100 * s['refused_share']:>5.1f} %  ({who})"
        )
    return rows


async def phase(name: str, turn, base_url: str, args: argparse.Namespace, counted: list | None = None) -> dict:
    itpm = name == "itpm"
    values = {"rpm": None, "itpm": args.itpm} if itpm else {"rpm": RPM, "itpm": None}
    values["burst_s"] = args.burst_s if name == "cold" else None
    kind = "itpm" if itpm else "rpm"
    set_full(base_url, **values)
    start, started = limits(base_url), time.perf_counter()
    loop = asyncio.create_task(closed_loop(turn, args.concurrency, 10**9, args.seconds))
    cut = 0.0
    if name == "halved":
        await asyncio.sleep(args.seconds / 2)  # the first half of the run at the full rate limit
        before = limits(base_url)["remaining"][kind]
        cut = before - limits(base_url, rpm=RPM // 2)["remaining"][kind]
    await asyncio.sleep(max(0.0, started + args.seconds - time.perf_counter()))  # the rest of the measured run
    stopped, at_stop = time.perf_counter(), limits(base_url)
    timings, seconds = await loop
    end = limits(base_url)
    limit_per_s = (args.itpm if itpm else RPM) / 60
    if name == "halved":  # the limit in force, averaged over the window
        limit_per_s = (RPM / 60 + RPM / 120) / 2
    burst = start["remaining"][kind] - at_stop["remaining"][kind] - cut
    return summary(
        name,
        timings,
        seconds,
        end["refused"] - start["refused"],
        limit_per_s,
        "input tokens" if itpm else "calls",
        (started, stopped, burst),
        counted or [],
    )


async def measure(fleet: Fleet, settings, args: argparse.Namespace, say) -> list[dict]:
    driver = FleetDriver(settings, timeout=settings.turn_deadline_s + 60)
    await driver.start()
    local = InProcessLoop(settings, plain=True)
    # a text of its own per turn: identical transcripts would all be cache reads, which no input-token limit counts
    fleet_turn = lambda i: driver.turn(f"{TEXT} (ref {i})", CUSTOMERS[i % len(CUSTOMERS)], PERSONA)  # noqa: E731
    results = []
    try:
        limits(settings.model_base_url, rpm=None, itpm=None, burst_s=None)
        if "cold" in args.phases:  # before any call: the limiter has seen no answer
            results.append(await phase("cold", fleet_turn, settings.model_base_url, args))
            say(line(results[-1]))
            limits(settings.model_base_url, rpm=None, itpm=None, burst_s=None)
        await closed_loop(fleet_turn, 10, 30, 60)  # warm: connections, caches
        for name in (name for name in args.phases if name != "cold"):
            if name == "replicas":
                add_model_replicas(fleet, 3, say)
                await asyncio.sleep(5.0)  # the group rebalances
            turn = (
                (lambda i: local.turn(f"{TEXT} (ref {i})", CUSTOMERS[i % len(CUSTOMERS)], PERSONA))
                if name == "inprocess"
                else fleet_turn
            )
            driver.count_tokens, driver.tokens = name == "itpm", []
            results.append(await phase(name, turn, settings.model_base_url, args, driver.tokens))
            say(line(results[-1]))
        say("side by side (the same limit, the same turns):")
        for row in side_by_side(results):
            say(row)
    finally:
        await driver.stop()
        await local.aclose()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_ratelimit", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--phases", type=lambda s: s.split(","), default=["cold", "rpm", "itpm", "halved", "inprocess", "replicas"]
    )
    parser.add_argument(
        "--burst-s",
        type=float,
        default=1.0,
        help="the cold phase's limit is enforced over this many seconds (default 1)",
    )
    parser.add_argument("--seconds", type=float, default=90.0, help="length of each phase (default 90)")
    parser.add_argument("--concurrency", type=int, default=60, help="turns in flight (default 60)")
    parser.add_argument(
        "--itpm", type=int, default=15_000, help="the itpm phase's input tokens a minute (default 15000)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args(argv)
    say = lambda text: print(text, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="roundtrip-ratelimit-") as state:
        settings, env = bench_settings(Path(state), 6, 1000.0, 0.3)
        fleet = Fleet(settings, env=env, say=say)
        try:
            fleet.start()
            results = asyncio.run(measure(fleet, settings, args, say))
        finally:
            fleet.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
