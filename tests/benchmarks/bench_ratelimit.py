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
of calls answered 429). Each phase also says, after its first `--settle-s` seconds (10), the share of calls answered
429 and the share of the admitted rate used. Figures go to docs/benchmarks.md by hand.

`--platform bedrock` (or vertex, foundry) runs the fleet's model service on that platform from its start (the SDK's own
client, the simulator in the platform's shape), whose throttle is a 429 without any `anthropic-ratelimit-*` header
(Bedrock and Vertex AI without retry-after too): the limiter has only the 429s to learn from (its AIMD window,
services/_model/capacity.py). Its default phase is `cold` alone, issue 43's bar: the simulator admitting 10 calls a
second (600 a minute over 1 s), 60 turns in flight, a cold fleet; every turn end_turn, <= 5 % of calls answered 429
after the first 10 s, >= 85 % of the admitted rate used.

    .venv/bin/python -m tests.benchmarks.bench_ratelimit [--phases cold,rpm,itpm,halved,replicas,inprocess] \
        [--seconds 90] [--burst-s 1] [--platform bedrock]
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
from tests.e2e.test_model_providers_e2e import PLATFORMS, platform_env

RPM = 600
BAR = (0.05, 0.85)  # a platform's cold phase: at most this share of calls answered 429 after settling, at least this
# share of the admitted rate used


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
    settled: tuple[float, int, int] = (0.0, 0, 0),
) -> dict:
    """`settled`: (when the first `--settle-s` seconds ended, on the perf_counter axis; the simulator's 429s then, and
    at the end). `window`: (its start and end on the perf_counter axis, what the bucket's store paid for in it: its
    level at the start less at the end, less what a lowered limit cut off). The window is the time turns were being
    started (60 in flight); the phase goes on until the last of them ends, with fewer and fewer in flight."""
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
    settle_at, refused_then, refused_end = settled
    answered_after = sum(1 for t in timings for at in t.responses if at >= settle_at)
    refused_after = refused_end - refused_then
    used_after = sum(1 for t in timings for at in t.responses if settle_at <= at <= end)
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
        "refused_after_share": refused_after / max(1, answered_after + refused_after),
        "used_after_share": used_after / max(1e-9, (end - settle_at) * per_s_limit) if end > settle_at else 0.0,
    }


def line(s: dict) -> str:
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(s["outcomes"].items()))
    return (
        f"  {s['phase']:<10} {s['turns']} turns ({outcomes}); {s['calls']} calls, {s['refused']} 429s "
        f"({100 * s['refused_share']:.1f} %); while 60 were in flight ({s['window_s']:.0f} s) {s['window_per_s']:.1f} "
        f"{s['unit']}/s, {s['burst']:.0f} from the bucket's store, the rest {100 * s['refill_share']:.0f} % of the "
        "limit "
        f"({s['limit_per_s']:.1f}/s); whole phase {s['used_per_s']:.1f}/s in {s['seconds']:.0f} s; "
        f"turn p50 {s['p50_s']:.1f} s, p99 {s['p99_s']:.1f} s; after the first {s['settle_s']:.0f} s "
        f"{100 * s['refused_after_share']:.1f} % of calls answered 429, {100 * s['used_after_share']:.0f} % of the "
        "admitted rate used"
    )


def verdict(s: dict) -> str:
    """Issue 43's bar for a phase under a throttle without headers."""
    turns_ok = s["outcomes"].get("end_turn", 0) == s["turns"]
    met = turns_ok and s["refused_after_share"] <= BAR[0] and s["used_after_share"] >= BAR[1]
    return (
        f"  bar ({'met' if met else 'NOT met'}): every turn end_turn {'yes' if turns_ok else 'no'}, "
        f"429s after settling {100 * s['refused_after_share']:.1f} % (<= {100 * BAR[0]:.0f} %), admitted rate used "
        f"{100 * s['used_after_share']:.0f} % (>= {100 * BAR[1]:.0f} %)"
    )


def side_by_side(results: list[dict]) -> list[str]:
    """The phases' turns and 429 shares in one table: the fleet's phases beside the plain in-process loop."""
    rows = ["  phase      end_turn  model_error  other  429s among calls  429s after settling  admitted rate used"]
    for s in results:
        outcomes = Counter(s["outcomes"])
        done, failed = outcomes.pop("end_turn", 0), outcomes.pop("model_error", 0)
        who = "plain loop" if s["phase"] == "inprocess" else "fleet"
        rows.append(
            f"  {s['phase']:<10} {done:>8}  {failed:>11}  {sum(outcomes.values()):>5}  "
            f"{100 * s['refused_share']:>14.1f} %  {100 * s['refused_after_share']:>17.1f} %  "
            f"{100 * s['used_after_share']:>16.0f} %  ({who})"
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
    settle_at = started + min(args.settle_s, args.seconds)
    settled = asyncio.create_task(_refused_at(base_url, settle_at))
    cut = 0.0
    if name == "halved":
        await asyncio.sleep(args.seconds / 2)  # the first half of the run at the full rate limit
        before = limits(base_url)["remaining"][kind]
        cut = before - limits(base_url, rpm=RPM // 2)["remaining"][kind]
    await asyncio.sleep(max(0.0, started + args.seconds - time.perf_counter()))  # the rest of the measured run
    stopped, at_stop = time.perf_counter(), limits(base_url)
    timings, seconds = await loop
    end = limits(base_url)
    refused_then = await settled
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
        (settle_at, refused_then, at_stop["refused"]),
    ) | {"settle_s": settle_at - started, "platform": args.platform}


async def _refused_at(base_url: str, at: float) -> int:
    """The simulator's count of 429s at `at` (perf_counter)."""
    # the moment of the run the count is read at (the settle time after the cold start)
    await asyncio.sleep(max(0.0, at - time.perf_counter()))
    return (await asyncio.to_thread(limits, base_url))["refused"]


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
            if args.platform != "anthropic":
                say(verdict(results[-1]))
            limits(settings.model_base_url, rpm=None, itpm=None, burst_s=None)
        if any(name != "cold" for name in args.phases):
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
        "--phases",
        type=lambda s: s.split(","),
        default=None,
        help="default: cold,rpm,itpm,halved,inprocess,replicas; with --platform, cold",
    )
    parser.add_argument(
        "--platform",
        choices=["anthropic", *PLATFORMS],
        default="anthropic",
        help="the model service's platform (ROUNDTRIP_MODEL_PROVIDER) against the simulator in its shape",
    )
    parser.add_argument(
        "--settle-s", type=float, default=10.0, help="429s and the rate used are counted after this (default 10)"
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
    if args.phases is None:
        args.phases = (
            ["cold"] if args.platform != "anthropic" else ["cold", "rpm", "itpm", "halved", "inprocess", "replicas"]
        )
    say = lambda text: print(text, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="roundtrip-ratelimit-") as state:
        settings, env = bench_settings(Path(state), 6, 1000.0, 0.3)
        if args.platform != "anthropic":  # the model service on the platform from its start: a cold fleet there
            env |= platform_env(settings, args.platform)
            say(f"model service on {args.platform}: the simulator's throttle sends no rate-limit header")
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
