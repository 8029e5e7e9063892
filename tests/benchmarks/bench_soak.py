"""Soak: steady load for N minutes on PostgreSQL with the ledger's retention cycling, sampled every minute (issue 31).

    .venv/bin/python -m tests.benchmarks.bench_soak                 # 60 minutes (the figure docs/benchmarks.md wants)
    .venv/bin/python -m tests.benchmarks.bench_soak --minutes 5     # a short run: its slopes say little

The fleet (`roundtrip up`'s processes, embedded Kafka) keeps ledger, fence and conversations on a throwaway
PostgreSQL server with its durable defaults; the simulator answers in 1 s (±30 %); a closed loop of `--concurrency`
clients asks the careful persona "where is my order?" (3 model calls a turn) for the demo customers. The guard's
retention is set short (`--retention-s`, default 120 s) so ended turns are deleted during the run; the requests topic's
retention.ms is set below it first (the guard refuses a shorter ledger retention, services/_guard/retention.py).

Every `--sample-s` (default 60 s) it samples each service's RSS, open file descriptors and PostgreSQL connections
(its sockets to the server's port), the ledger's rows, the database's size, the outbox's backlog (turns whose
decision is recorded but not yet published), the consumer groups' lag, and turns/s; at the end it prints the table,
each figure's slope per hour over the samples after the warm-up (`--warmup-min`, default 10, at most a third of the
run), the wrong turns (not `end_turn` with 3 calls, or no reply within 60 s), and a plot (`--plot`). Not part of the
CI pass/fail: a service whose memory grows without bound is a defect to fix, not a figure to report.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from roundtrip._fleet.launcher import Fleet
from tests.benchmarks.bench_loop import CALLS_PER_TURN, PERSONA, TEXT, bench_settings
from tests.benchmarks.fleet_driver import FleetDriver
from tests.databases import PostgresServer, find_pg_bindir
from tests.processes import restart

CUSTOMERS = ("cus_1001", "cus_1002", "cus_1003")
FIGURES = ("rss_mb", "fds", "db_conns")  # per service
TOTALS = ("ledger_rows", "db_mb", "outbox", "lag", "turns_per_s")


@dataclass
class Sample:
    at_min: float
    per_service: dict[str, dict[str, float]] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _sockets_to(port: int) -> set[str]:
    """Inodes of the TCP sockets connected to `port` (this host's namespace)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if int(parts[2].rsplit(":", 1)[1], 16) == port and parts[3] == "01":  # ESTABLISHED
                inodes.add(parts[9])
    return inodes


def _process(pid: int, pg_sockets: set[str]) -> dict[str, float]:
    fds = os.listdir(f"/proc/{pid}/fd")
    conns = 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in pg_sockets:
            conns += 1
    return {"rss_mb": _rss_mb(pid), "fds": len(fds), "db_conns": conns}


async def _database(url: str) -> dict[str, float]:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url, pool_size=1, max_overflow=0)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT count(*) FROM turns"))).scalar_one()
            outbox = (await conn.execute(text("SELECT count(*) FROM turns WHERE pending IS NOT NULL"))).scalar_one()
            size = (await conn.execute(text("SELECT pg_database_size(current_database())"))).scalar_one()
    finally:
        await engine.dispose()
    return {"ledger_rows": rows, "db_mb": size / 1e6, "outbox": outbox}


async def _lag(settings) -> float:
    from roundtrip._kernel.kafka.admin import consumer_lag
    from roundtrip._kernel.kafka.clients import kafka_clients

    return float(sum(g.lag for g in await consumer_lag(kafka_clients(settings), settings.topic_prefix, None)))


async def _shorten_requests_retention(settings, ms: int) -> None:
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from roundtrip._kernel.kafka.admin import _admin
    from roundtrip._kernel.kafka.clients import kafka_clients
    from roundtrip._kernel.wire import topics

    admin = _admin(kafka_clients(settings), 30000)
    await admin.start()
    try:
        name = topics.t(topics.SUPPORT_REQUESTS, settings.topic_prefix)
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, {"retention.ms": str(ms)})])
    finally:
        await admin.close()


async def soak(fleet: Fleet, settings, url: str, pg_port: int, args: argparse.Namespace) -> tuple[list[Sample], dict]:
    driver = FleetDriver(settings, timeout=60.0)
    await driver.start()
    done: list[tuple[float, str, int]] = []  # (monotonic end, outcome, steps)
    stop_at = time.monotonic() + args.minutes * 60
    customers = itertools.cycle(CUSTOMERS)

    async def client() -> None:
        while time.monotonic() < stop_at:
            t = await driver.turn(TEXT, next(customers), PERSONA)
            done.append((time.monotonic(), t.outcome, t.steps))

    clients = [asyncio.create_task(client()) for _ in range(args.concurrency)]
    samples: list[Sample] = []
    started = last = time.monotonic()
    counted = 0
    try:
        while time.monotonic() < stop_at:
            # the interval between two samples of the soak
            await asyncio.sleep(min(args.sample_s, max(0.0, stop_at - time.monotonic())))
            now = time.monotonic()
            pg_sockets = _sockets_to(pg_port)
            sample = Sample(at_min=(now - started) / 60)
            for child in fleet.children:
                if child.process.poll() is None:
                    sample.per_service[child.name] = _process(child.process.pid, pg_sockets)
            sample.totals = await _database(url)
            sample.totals["lag"] = await _lag(settings)
            sample.totals["turns_per_s"] = (len(done) - counted) / max(1e-9, now - last)
            counted, last = len(done), now
            samples.append(sample)
            print(_row(sample), flush=True)
    finally:
        await asyncio.gather(*clients, return_exceptions=True)
        await driver.stop()
    wrong = sum(1 for _, outcome, steps in done if outcome != "end_turn" or steps != CALLS_PER_TURN)
    return samples, {"turns": len(done), "wrong": wrong}


def _row(s: Sample) -> str:
    services = " ".join(
        f"{name} {f['rss_mb']:.0f}MB/{f['fds']:.0f}fd/{f['db_conns']:.0f}db"
        for name, f in sorted(s.per_service.items())
    )
    t = s.totals
    return (
        f"[soak] {s.at_min:5.1f} min: {t['turns_per_s']:.1f} turns/s, ledger {t['ledger_rows']:.0f} rows, "
        f"db {t['db_mb']:.1f} MB, outbox {t['outbox']:.0f}, lag {t['lag']:.0f}; {services}"
    )


def slope_per_hour(xs_min: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (minutes), per hour; NaN with fewer than two points."""
    n = len(xs_min)
    if n < 2:
        return float("nan")
    mx, my = sum(xs_min) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs_min)
    return float("nan") if var == 0 else 60 * sum((x - mx) * (y - my) for x, y in zip(xs_min, ys, strict=True)) / var


def report(samples: list[Sample], outcome: dict, args: argparse.Namespace) -> str:
    warm = min(args.warmup_min, args.minutes / 3)
    kept = [s for s in samples if s.at_min > warm] or samples
    xs = [s.at_min for s in kept]
    lines = [
        f"soak: {args.minutes:g} min at concurrency {args.concurrency}, model latency 1000 ms, retention "
        f"{args.retention_s:g} s; {outcome['turns']} turns, {outcome['wrong']} wrong; slopes per hour after "
        f"{warm:g} min ({len(kept)} samples):"
    ]
    for name in sorted({n for s in kept for n in s.per_service}):
        figures = [
            f"{fig} {slope_per_hour(xs, [s.per_service.get(name, {}).get(fig, float('nan')) for s in kept]):+.2f}"
            for fig in FIGURES
        ]
        lines.append(f"  {name}: " + ", ".join(figures) + " (MB, fds, connections per hour)")
    totals = [f"{t} {slope_per_hour(xs, [s.totals[t] for s in kept]):+.1f}" for t in TOTALS]
    lines.append("  totals: " + ", ".join(totals) + " per hour")
    return "\n".join(lines)


def plot(samples: list[Sample], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'): no plot"
    xs = [s.at_min for s in samples]
    fig, axes = plt.subplots(2, 3, figsize=(15, 7))
    for ax, fig_name in zip(axes[0], FIGURES, strict=True):
        for name in sorted({n for s in samples for n in s.per_service}):
            ax.plot(xs, [s.per_service.get(name, {}).get(fig_name, float("nan")) for s in samples], label=name)
        ax.set_title(fig_name)
        ax.set_xlabel("minutes")
    axes[0][0].legend(fontsize=7)
    for ax, (label, keys) in zip(
        axes[1], (("ledger rows, outbox", ("ledger_rows", "outbox")), ("db MB, lag", ("db_mb", "lag")),
                  ("turns/s", ("turns_per_s",))), strict=True,
    ):  # fmt: skip
        for key in keys:
            ax.plot(xs, [s.totals[key] for s in samples], label=key)
        ax.set_title(label)
        ax.set_xlabel("minutes")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    return f"plot written to {path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.bench_soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the load runs (default 60)")
    parser.add_argument("--concurrency", type=int, default=20, help="clients, each a turn at a time (default 20)")
    parser.add_argument("--retention-s", type=float, default=120.0, help="ROUNDTRIP_LEDGER_RETENTION_S (default 120)")
    parser.add_argument(
        "--reply-memory-s", type=float, default=300.0, help="ROUNDTRIP_REPLY_MEMORY_S of the gateway (default 300)"
    )
    parser.add_argument("--sample-s", type=float, default=60.0, help="seconds between samples (default 60)")
    parser.add_argument("--warmup-min", type=float, default=10.0, help="minutes left out of the slopes (default 10)")
    parser.add_argument("--plot", type=Path, default=Path("soak.png"), help="where the plot goes (default soak.png)")
    parser.add_argument(
        "--trace-memory",
        metavar="SERVICE",
        action="append",
        default=[],
        help="count SERVICE's live objects each sample (python -m tests.benchmarks.memtrace reads them)",
    )
    parser.add_argument(
        "--trace-holders",
        metavar="TYPE",
        default="",
        help="with --trace-memory: also write what refers to a few live objects of the type named TYPE",
    )
    args = parser.parse_args(argv)
    bindir = find_pg_bindir()
    if bindir is None:
        raise SystemExit("no PostgreSQL server binaries (initdb, postgres) found (Debian: apt-get install postgresql)")
    server = PostgresServer(bindir, durable=True)
    state = Path(tempfile.mkdtemp(prefix="roundtrip-soak-"))
    try:
        url = server.start()
        settings, env = bench_settings(state, 4, latency_ms=1000, jitter=0.3, database_url=url)
        # the gateway's memory of answered turns cycles within the run too, as the ledger's retention does
        env["ROUNDTRIP_REPLY_MEMORY_S"] = str(args.reply_memory_s)
        print(f"[soak] PostgreSQL on port {server.port}; starting the fleet in {state}", flush=True)

        def traced(name: str) -> dict[str, str]:
            if name not in args.trace_memory:
                return {}
            (state / "memtrace").mkdir(exist_ok=True)
            here = str(Path(__file__).parent / "memtrace")
            print(f"[soak] {name} counted: python -m tests.benchmarks.memtrace {state / 'memtrace'}")
            return {
                "PYTHONPATH": os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])]),
                "ROUNDTRIP_MEMTRACE_DIR": str(state / "memtrace"),
                "ROUNDTRIP_MEMTRACE_S": str(args.sample_s),
                "ROUNDTRIP_MEMTRACE_NAME": name,
                "ROUNDTRIP_MEMTRACE_HOLDERS": args.trace_holders,
            }

        with Fleet(settings, env=env) as fleet:
            # the ledger's retention must outlast the requests topic's: shorten the topic's, then the guard's
            asyncio.run(_shorten_requests_retention(settings, int(args.retention_s * 1000 / 2)))
            restart(fleet, "guard", {**env, "ROUNDTRIP_LEDGER_RETENTION_S": str(args.retention_s), **traced("guard")})
            for name in set(args.trace_memory) - {"guard"}:
                restart(fleet, name, {**env, **traced(name)})
            samples, outcome = asyncio.run(soak(fleet, settings, url, server.port, args))
        print(report(samples, outcome, args), flush=True)
        print(plot(samples, args.plot), flush=True)
        return 0 if samples else 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
