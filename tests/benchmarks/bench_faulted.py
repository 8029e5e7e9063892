"""The faulted soak: steady load on PostgreSQL while a real fault lands every period, sampled as the soak is (issue 52).

    .venv/bin/python -m tests.benchmarks.bench_faulted --minutes 60 --faults every:10m   # the faulted hour
    .venv/bin/python -m tests.benchmarks.bench_faulted --minutes 6 --faults every:1m     # a smoke test

The fleet (the chaos suite's: its own broker, two executors, a stuck turn ended in ~20 s, tests/chaos/conftest.py)
keeps ledger, fence and conversations on a throwaway PostgreSQL server (durable defaults). An app publishes the chaos
mix (cancels, escalations, lookups; some requests twice) at `--rate` requests/s over many conversations, after one
poison message on every consumed topic. Fault k lands at (k + 1/2) periods, in the order of `--only`
(tests/benchmarks/faults.py): the broker SIGKILLed and restarted, PostgreSQL SIGKILLed and restarted, the broker
SIGSTOPped 30 s, each service SIGKILLed in turn (the executors mid-batch), the shop away 60 s, the Messages API
answering 529 for 60 s. Every `--sample-s` the soak's figures (tests/benchmarks/bench_soak.py: RSS, open files,
PostgreSQL connections per process; ledger rows, lag) and the app's (requests, replies, lost, duplicated replies and
side effects, dead letters) are sampled and every service's /metrics scraped; after the load, every request gets
`--drain-s` to be answered, then the chaos audit runs. Per fault: the seconds from its end until replies flow again
(a 10-second window with half the offered rate's worth) and to the first reply to a request sent after it, and the
p99 reply latency of the requests sent in the two minutes after it; with a rules file, which alerts fired and when
they cleared (tests/benchmarks/alerts.py). The report (markdown, `--report`) and the plot (`--plot`); the exit status
is 1 when a bound is broken (tests/benchmarks/faulted_report.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.wire import topology
from tests.agents import ShopFleetSettings
from tests.benchmarks import faulted_report
from tests.benchmarks.alerts import Scrapes, evaluate
from tests.benchmarks.bench_soak import Sample, _database, _lag, _process, _sockets_to
from tests.benchmarks.faults import FAULTS, Rig
from tests.chaos.conftest import ChaosFleet, _env, fleet_values
from tests.chaos.harness import (
    CONSUMED,
    Audit,
    Fault,
    Observer,
    Planned,
    check_dead_letters,
    executions,
    judge,
    ledger_rows,
    new_tag,
    plan_load,
    poison_messages,
    seed_customers,
    send_poison,
    side_effects,
)
from tests.databases import PostgresServer, find_pg_bindir
from tests.ports import free_port_run
from tests.processes import embedded_kafka

HOUR = ("broker-kill", "postgres-kill", "broker-stop", "services-kill", "shop-away", "overload")
SAMPLE_TIMEOUT_S = 15.0  # a figure whose source is the fault of the moment (the broker, the database) is left out
REPLICA_PORTS = 3  # health ports scraped per service: a replica, or a restarted one whose old port was still taken


@dataclass
class Injected:
    """One fault as it happened: its kind, what it did (the harness's Faults), and its span (epoch seconds)."""

    kind: str
    made: list[Fault]
    at: float
    until: float
    recovery_s: float = math.nan
    new_answered_s: float = math.nan
    p99_after_s: float = math.nan
    error: str = ""


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    injected: list[Injected] = field(default_factory=list)
    sent_at: dict[str, float] = field(default_factory=dict)  # request id -> first publish (epoch)
    plan: list[Planned] = field(default_factory=list)  # what was sent
    audit: Audit | None = None
    poison_sent: int = 0
    poison_problems: list[str] = field(default_factory=list)
    stray_letters: list[str] = field(default_factory=list)  # dead letters of anything but the poison
    pids: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)  # name -> (pid, at_min, rss)
    replies: dict[str, list] = field(default_factory=dict)  # request id -> (reply, timestamp) of those sent
    started_epoch: float = 0.0
    stop_at: float = 0.0  # monotonic: the load's end, pushed on to AFTER_S past each fault's end
    faulting: bool = False  # a fault is being injected: the load goes on

    def loading(self) -> bool:
        return self.faulting or time.monotonic() < self.stop_at


def parse_faults(spec: str) -> float:
    """`every:10m` / `every:90s` -> the period in seconds; one line naming the problem otherwise."""
    kind, _, every = spec.partition(":")
    units = {"s": 1, "m": 60, "h": 3600}
    if kind != "every" or not every or every[-1] not in units:
        raise SystemExit(f"--faults {spec!r}: expected every:<n>s|m|h, e.g. every:10m")
    try:
        period = float(every[:-1]) * units[every[-1]]
    except ValueError:
        raise SystemExit(f"--faults {spec!r}: expected every:<n>s|m|h, e.g. every:10m") from None
    if period <= 0:
        raise SystemExit(f"--faults {spec!r}: the period must be positive")
    return period


def schedule(minutes: float, period_s: float, kinds: list[str]) -> list[tuple[float, str]]:
    """(seconds from the start, kind): fault k at (k + 1/2) periods while the load runs, kinds in rotation."""
    out, rotation = [], itertools.cycle(kinds)
    k = 0
    while (at := (k + 0.5) * period_s) < minutes * 60:
        out.append((at, next(rotation)))
        k += 1
    return out


def health_targets(base: int) -> dict[int, str]:
    """port -> service of every /metrics the fleet may serve (services/_kernel/observability/health.py's layout)."""
    names = topology.names()
    stride = len(topology.SERVICES)
    return {base + i + stride * r: name for r in range(REPLICA_PORTS) for i, name in enumerate(names)}


async def _bounded(coro, default):
    try:
        return await asyncio.wait_for(coro, SAMPLE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - the database or broker being the fault of the moment
        return default


async def _drive(observer: Observer, run: Run, plan: list[Planned], rate: float) -> None:
    """A user's app: each request published at `rate`, a `twice` one again a few requests later (a retry)."""
    retries: list[Planned] = []
    for planned in plan:
        if not run.loading():
            break
        at = time.time()
        with contextlib.suppress(Exception):  # the broker away for longer than the app's retries: sent late or not
            await observer.ask(planned)
            run.sent_at[planned.request.request_id] = at
            run.plan.append(planned)
            if planned.twice:
                retries.append(planned)
            if len(retries) > 2:
                await observer.ask(retries.pop(0))
        await asyncio.sleep(1 / rate)  # pacing: the next request is due at the offered rate
    for planned in retries:
        with contextlib.suppress(Exception):
            await observer.ask(planned)


async def _sample(rig: Rig, settings, url: str, run: Run, scrapes: Scrapes, started: float) -> None:
    fleet = rig.fleet
    now = time.time()
    sample = Sample(at_min=(time.monotonic() - started) / 60)
    pg_sockets = _sockets_to(rig.database.port)
    for child in fleet.sync.children:
        if child.process.poll() is None:
            with contextlib.suppress(OSError):  # it died between the poll and the read
                sample.per_service[child.name] = _process(child.process.pid, pg_sockets)
                rss = sample.per_service[child.name]["rss_mb"]
                run.pids.setdefault(child.name, []).append((child.process.pid, sample.at_min, rss))
    nan = math.nan
    sample.totals = await _bounded(_database(url), {"ledger_rows": nan, "db_mb": nan, "outbox": nan})
    sample.totals["lag"] = await _bounded(_lag(settings), nan)
    replies = run_replies(run, rig.observer)
    sent = len(run.plan)
    due = [rid for rid, t in run.sent_at.items() if now - t > faulted_report.LOST_AFTER_S]
    effects = await _bounded(side_effects(settings), [])
    sample.totals |= {
        "requests": sent,
        "replies": len(replies),
        "lost": sum(1 for rid in due if rid not in replies),
        "duplicated": sum(1 for got in replies.values() if len(got) > 1),
        "duplicate_side_effects": faulted_report.duplicate_effects(effects),
        "dead_letters": len(rig.observer.seen.dead_letters),
        "scraped": await scrapes.scrape(now),
    }
    run.samples.append(sample)
    print(faulted_report.row(sample), flush=True)


def run_replies(run: Run, observer: Observer) -> dict[str, list]:
    mine = run.sent_at
    return {rid: got for rid, got in observer.seen.replies.items() if rid in mine}


async def faulted(rig: Rig, settings, url: str, args, scrapes: Scrapes) -> Run:
    run = Run()
    observer = rig.observer
    tag = new_tag("soak")
    customers = await seed_customers(settings, tag, 60, cancellable=8)
    poison = [p for topic in CONSUMED for p in poison_messages(topic, tag) if p.kind == "malformed_json"]
    await send_poison(observer, poison)
    run.poison_sent = len(poison)
    requests = int(args.rate * (args.minutes * 60 + faulted_report.AFTER_S + 120))  # a fault may push the end on
    plan = plan_load(tag, customers, conversations=max(20, int(args.rate * 40)), requests=requests)
    started, run.started_epoch = time.monotonic(), time.time()
    run.stop_at = started + args.minutes * 60
    load = asyncio.create_task(_drive(observer, run, plan, args.rate))
    faults = asyncio.create_task(_inject(rig, run, schedule(args.minutes, args.period_s, args.only), started))
    try:
        while run.loading():
            left = run.stop_at - time.monotonic()
            await asyncio.sleep(min(args.sample_s, left) if left > 0 else args.sample_s)  # the sample interval
            await _sample(rig, settings, url, run, scrapes, started)
        await load
        await faults
        deadline = time.monotonic() + args.drain_s
        while time.monotonic() < deadline and len(run_replies(run, observer)) < len(run.sent_at):
            await asyncio.sleep(min(args.sample_s, max(0.1, deadline - time.monotonic())))  # draining, still sampled
            await _sample(rig, settings, url, run, scrapes, started)
        await asyncio.sleep(5)  # the window a late duplicate reply would come in
    finally:
        load.cancel()
        faults.cancel()
    run.replies = run_replies(run, observer)
    made = [f for i in run.injected for f in i.made]
    run.audit = judge(
        Audit("faulted soak", requests=len(run.plan)),
        run.plan,
        observer.seen.replies,
        ledger_rows(settings),
        await side_effects(settings),
        await executions(settings),
        faults=made,
        kills=rig.fleet.kills,  # a call run again is excused only by its executor's SIGKILL mid-batch
        batches=list(observer.seen.batches),
    )
    _, run.poison_problems = check_dead_letters(observer, poison)
    where = {(observer.topic(p.topic), p.partition, p.offset) for p in poison}
    run.stray_letters = [
        f"{d['topic']}: {str(d.get('reason'))[:120]}"
        for d in observer.seen.dead_letters
        if (d["topic"], d.get("partition"), d.get("offset")) not in where
    ]
    faulted_report.recoveries(run, args.rate)
    return run


async def _inject(rig: Rig, run: Run, plan: list[tuple[float, str]], started: float) -> None:
    for at_s, kind in plan:
        await asyncio.sleep(max(0.0, started + at_s - time.monotonic()))  # until the fault is due
        print(f"[faulted] {(time.monotonic() - started) / 60:5.1f} min: {kind}", flush=True)
        at, run.faulting = time.time(), True
        try:
            made = await FAULTS[kind](rig)
            run.injected.append(Injected(kind, made, made[0].at, made[-1].until or made[-1].at))
        except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported, and fails the run
            run.injected.append(Injected(kind, [Fault(kind, at, time.time())], at, time.time(), error=repr(exc)))
        run.stop_at = max(run.stop_at, time.monotonic() + faulted_report.AFTER_S)  # the window its p99 is taken over
        run.faulting = False


def settings_for(kafka, state: Path, url: str, args) -> tuple[ShopFleetSettings, dict[str, str], int]:
    base = free_port_run(len(topology.SERVICES) * REPLICA_PORTS)
    values = fleet_values(kafka.bootstrap, state) | {
        "ledger_database_url": url,
        "conversations_database_url": url,
        "database_allow_shared_login": True,  # one (superuser) login for the fleet, on purpose
        "simulator_latency_ms": args.latency_ms,
        "health_port": base,
        "health_port_per_service": True,
        # the gateway remembers the turns it answered for this long and so grows for that long by design: a window
        # that fills within the warm-up lets the RSS judged after it show a leak, not the window filling
        "reply_memory_s": min(3600.0, args.warmup_min * 60),
    }
    return ShopFleetSettings(**values), _env(**values), base


def run_profile(args: argparse.Namespace) -> tuple[Run, str, bool]:
    """Start PostgreSQL, a broker and the fleet, run the faulted load, stop them: (run, report, bounds held)."""
    bindir = find_pg_bindir()
    if bindir is None:
        raise SystemExit("no PostgreSQL server binaries (initdb, postgres) found (Debian: apt-get install postgresql)")
    server = PostgresServer(bindir, durable=True)
    state = Path(tempfile.mkdtemp(prefix="roundtrip-faulted-"))
    try:
        url = server.start()
        with embedded_kafka(state / "kafka") as kafka:
            settings, env, base = settings_for(kafka, state / "fleet", url, args)
            print(f"[faulted] PostgreSQL on port {server.port}; the fleet in {state}", flush=True)
            with Fleet(settings, env=env, executor_replicas=2) as sync:
                scrapes = Scrapes(health_targets(base))
                run = asyncio.run(_main(ChaosFleet(sync, kafka), server, settings, url, args, scrapes))
            scrapes.save(metrics_path(args.report))
            evaluated = evaluate(scrapes, args.rules, int(args.sample_s))
    finally:
        server.stop()
    text, held = faulted_report.report(run, evaluated, args)
    return run, text, held


async def _main(fleet: ChaosFleet, server: PostgresServer, settings, url: str, args, scrapes: Scrapes) -> Run:
    async with Observer(settings) as observer:
        rig = Rig(fleet, server, observer, f"http://127.0.0.1:{settings.simulator_port}")
        return await faulted(rig, settings, url, args, scrapes)


def metrics_path(report: Path) -> Path:
    return report.with_name(report.stem + "-metrics.json")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.bench_faulted", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0, help="how long the load runs (default 60)")
    p.add_argument("--faults", default="every:10m", help="every:<n>s|m|h, the period of the faults (default every:10m)")
    p.add_argument("--only", default=",".join(HOUR), help=f"the faults in rotation (default {','.join(HOUR)})")
    p.add_argument("--rate", type=float, default=3.0, help="requests published per second (default 3)")
    p.add_argument("--latency-ms", type=float, default=1000.0, help="the simulator's latency (default 1000, ±30 %%)")
    p.add_argument("--sample-s", type=float, default=60.0, help="seconds between samples (default 60)")
    p.add_argument("--warmup-min", type=float, default=10.0, help="a process's minutes left out of its RSS slope")
    p.add_argument("--drain-s", type=float, default=360.0, help="after the load, how long replies may take (360)")
    p.add_argument(
        "--rules", type=Path, default=None, help="alert rules (default deploy/prometheus/roundtrip-rules.yaml)"
    )
    p.add_argument("--report", type=Path, default=Path("faulted.md"), help="the report (default faulted.md)")
    p.add_argument("--plot", type=Path, default=Path("faulted.png"), help="the plot (default faulted.png)")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    args = parser().parse_args(argv)
    args.period_s = parse_faults(args.faults)
    args.only = [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = [k for k in args.only if k not in FAULTS]
    if unknown or not args.only:
        raise SystemExit(f"--only: unknown fault {unknown[0] if unknown else '(none)'!r}; known: {', '.join(FAULTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # the faults' reconnects: the fleet's logs have them
    run, text, held = run_profile(args)
    args.report.write_text(text)
    print(text, flush=True)
    print(faulted_report.plot(run, args.plot), flush=True)
    print(f"[faulted] report written to {args.report}; bounds {'held' if held else 'BROKEN'}", flush=True)
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
