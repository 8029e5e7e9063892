"""The faulted soak's figures, bounds, report (markdown) and plot (tests/benchmarks/bench_faulted.py).

The bounds (issue 52's "done when"), each broken one failing the run: no request without a reply, no reply
duplicated, no side effect duplicated (nor any other problem of the chaos audit: a call run twice that no fault
explains, a side effect after its turn's end, a stray reply), nothing dead-lettered but the poison (and all of it),
every fault injected, replies flowing within 30 s of each fault's end (a 10-second window ending by then with replies
at half the offered rate or more), and every service process's RSS slope under 5 MB/h after its first
`--warmup-min` minutes, over the quiet stretches between faults (from `SETTLE_MIN` after a fault's end to the next
fault; one slope fitted across them, each stretch its own level), judged for a process sampled over at least
`RSS_SPAN_MIN` such minutes (the report says which were not). A leak grows under steady load; what a fault raises
(records held in flight, connections opened again) is a step, reported per fault, and must stay flat after it.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter
from typing import TYPE_CHECKING

from roundtrip._kernel.wire import topology
from tests.benchmarks.alerts import Evaluated
from tests.benchmarks.bench_soak import Sample

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from tests.benchmarks.bench_faulted import Injected, Run

LOST_AFTER_S = 180.0  # a request unanswered this long counts as lost in a sample (the audit at the end decides)
RECOVERY_BOUND_S = 30.0
RSS_BOUND_MB_H = 5.0
RSS_SPAN_MIN = 5.0
SETTLE_MIN = 2.0  # after a fault's end, its retries and backlog drain before the RSS is judged again
AFTER_S = 120.0  # the window after a fault whose replies' p99 is reported
FLOWING_S = 10.0  # replies flow when a window this long holds half the offered rate's worth


def duplicate_effects(effects: list[dict]) -> int:
    """Side effects beyond one per call and one cancel per order (harness.judge's two counts)."""
    per_call = Counter((e["turn_id"], e["tool_use_id"]) for e in effects)
    per_order = Counter(e["order_id"] for e in effects if e["endpoint"] == "cancel_order")
    return sum(n - 1 for n in per_call.values()) + sum(n - 1 for n in per_order.values())


def row(s: Sample) -> str:
    t = s.totals
    services = " ".join(
        f"{n} {f['rss_mb']:.0f}MB/{f['fds']:.0f}fd/{f['db_conns']:.0f}db" for n, f in sorted(s.per_service.items())
    )
    return (
        f"[faulted] {s.at_min:5.1f} min: requests {t['requests']:.0f}, replies {t['replies']:.0f}, "
        f"lost {t['lost']:.0f}, dup {t['duplicated']:.0f}, dup effects {t['duplicate_side_effects']:.0f}, "
        f"dead letters {t['dead_letters']:.0f}, ledger {t['ledger_rows']:.0f}, lag {t['lag']:.0f}, "
        f"scraped {t['scraped']:.0f}; {services}"
    )


def p99(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def recoveries(run: Run, rate: float) -> None:
    """Per fault: seconds from its end until replies flow again (the end of the first FLOWING_S window after it with
    replies at half the offered `rate` or more: the bound; a trickle is not flowing) and to the first reply to a
    request sent after it (which waits behind the backlog the fault left); p99 latency of the replies to the requests
    sent in the AFTER_S after its end (a request without a reply counts as infinitely late)."""
    first = {rid: min(ts for _, ts in got) for rid, got in run.replies.items()}
    times = sorted(first.values())
    need = max(1, math.ceil(rate * FLOWING_S / 2))
    for fault in run.injected:
        fault.recovery_s = flowing_after(times, fault.until, need)
        after = [rid for rid, t in run.sent_at.items() if t >= fault.until]
        answered = [first[rid] for rid in after if rid in first]
        fault.new_answered_s = min(answered) - fault.until if answered else math.inf
        window = [rid for rid in after if run.sent_at[rid] < fault.until + AFTER_S]
        fault.p99_after_s = p99([first[rid] - run.sent_at[rid] if rid in first else math.inf for rid in window])


def flowing_after(times: list[float], since: float, need: int) -> float:
    """Seconds from `since` to the end of the first FLOWING_S window (starting at `since`, then a second later each
    time) holding `need` of the sorted reply `times`; inf when none does."""
    start = since
    while times and start <= times[-1]:
        if bisect.bisect_right(times, start + FLOWING_S) - bisect.bisect_left(times, start) >= need:
            return start + FLOWING_S - since
        start += 1.0
    return math.inf


def quiet(run: Run, at_min: float) -> int | None:
    """The quiet stretch a sample at `at_min` falls in (its index: faults before it), None: within a fault or its
    settling."""
    for i, f in enumerate(run.injected):
        if at_min < _min(run, f.at):
            return i
        if at_min < _min(run, f.until) + SETTLE_MIN:
            return None
    return len(run.injected)


def rss_slopes(run: Run, warmup_min: float) -> list[tuple[str, int, float | None, float]]:
    """(process, pid, slope in MB/h over its quiet stretches or None when too few of them were sampled past its
    warm-up, those stretches' minutes)."""
    out = []
    for name, seen in sorted(run.pids.items()):
        if name.split("-")[0] not in topology.names():
            continue  # the simulator, the shop, the console: not the fleet's services
        for pid in dict.fromkeys(p for p, _, _ in seen):
            points = [(m, r) for p, m, r in seen if p == pid]
            born = points[0][0]
            stretches: dict[int, list[tuple[float, float]]] = {}
            for m, r in points:
                if m - born >= warmup_min and (k := quiet(run, m)) is not None:
                    stretches.setdefault(k, []).append((m, r))
            slope, span = pooled_slope_per_hour(list(stretches.values()))
            out.append((name, pid, slope if span >= RSS_SPAN_MIN else None, span))
    return out


def pooled_slope_per_hour(stretches: list[list[tuple[float, float]]]) -> tuple[float, float]:
    """One least-squares slope (MB/h) across stretches of (minute, MB), each with its own level; and their minutes."""
    sxx = sxy = span = 0.0
    for points in stretches:
        if len(points) < 2:
            continue
        mx, my = sum(m for m, _ in points) / len(points), sum(r for _, r in points) / len(points)
        sxx += sum((m - mx) ** 2 for m, _ in points)
        sxy += sum((m - mx) * (r - my) for m, r in points)
        span += points[-1][0] - points[0][0]
    return (60 * sxy / sxx if sxx else math.nan), span


def rss_steps(run: Run) -> list[tuple[str, list[float | None]]]:
    """Per service process name, each fault's RSS step: the first sample after its settling against the last before
    it (None: the process restarted in between, or was not sampled)."""
    out = []
    for name, seen in sorted(run.pids.items()):
        if name.split("-")[0] not in topology.names():
            continue
        steps: list[float | None] = []
        for f in run.injected:
            before = [(p, r) for p, m, r in seen if m < _min(run, f.at)]
            after = [(p, r) for p, m, r in seen if m >= _min(run, f.until) + SETTLE_MIN]
            same = before and after and before[-1][0] == after[0][0]
            steps.append(after[0][1] - before[-1][1] if same else None)
        out.append((name, steps))
    return out


def broken(run: Run, args: argparse.Namespace) -> list[str]:
    out = [] if run.audit is None else list(run.audit.problems())
    if run.poison_problems:
        out.append(f"poison not dead-lettered intact: {'; '.join(run.poison_problems[:5])}")
    if run.stray_letters:
        out.append(f"dead-lettered besides the poison: {len(run.stray_letters)}: {'; '.join(run.stray_letters[:5])}")
    for f in run.injected:
        if f.error:
            out.append(f"{f.kind}: not injected: {f.error}")
        elif not f.recovery_s <= RECOVERY_BOUND_S:
            out.append(
                f"{f.kind}: replies flowed again {f.recovery_s:.1f} s after its end (bound {RECOVERY_BOUND_S:g})"
            )
    for name, pid, slope, _ in rss_slopes(run, args.warmup_min):
        if slope is not None and not slope < RSS_BOUND_MB_H:
            out.append(
                f"{name} (pid {pid}): RSS {slope:+.1f} MB/h between faults after its first {args.warmup_min:g} min"
            )
    return out


def _min(run: Run, epoch: float) -> float:
    return (epoch - run.started_epoch) / 60


def _alerts_of(run: Run, fault: Injected, following: float | None, evaluated: Evaluated) -> str:
    fired = []
    for name, spans in evaluated.spans.items():
        for start, end in spans:
            if fault.at - 60 <= start < (following or math.inf):
                cleared = f"cleared {_min(run, end):.1f}" if end is not None else "still firing at the end"
                fired.append(f"{name} {_min(run, start):.1f}-{cleared}")
    return "; ".join(fired) or ("(not evaluated)" if evaluated.missing else "none")


def report(run: Run, evaluated: Evaluated, args: argparse.Namespace) -> tuple[str, bool]:
    problems = broken(run, args)
    a = run.audit
    outcomes = ", ".join(f"{k} {v}" for k, v in a.outcomes.most_common()) if a else ""
    lines = [
        f"# The faulted soak, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(run.started_epoch))}",
        "",
        f"`bench_faulted --minutes {args.minutes:g} --faults {args.faults} --only {','.join(args.only)} "
        f"--rate {args.rate:g} --latency-ms {args.latency_ms:g}` on PostgreSQL. {len(run.plan)} requests, "
        f"{a.replies if a else 0} answered; outcomes: {outcomes}. Runs of side-effecting calls "
        f"{a.executions if a else 0}, re-runs a fault explains {len(a.reruns_after_faults) if a else 0}.",
        "",
        "## Bounds",
        "",
        "**held**" if not problems else "**BROKEN**:\n\n" + "\n".join(f"- {p}" for p in problems),
        "",
        "## Faults",
        "",
        "| at (min) | fault | lasted (s) | replies again after (s) | a new request answered after (s) "
        "| p99 reply, 2 min after (s) | alerts fired (min) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for i, f in enumerate(run.injected):
        following = run.injected[i + 1].at if i + 1 < len(run.injected) else None
        lines.append(
            f"| {_min(run, f.at):.1f} | {f.kind}{' (' + f.error + ')' if f.error else ''} | {f.until - f.at:.0f} | "
            f"{f.recovery_s:.1f} | {f.new_answered_s:.1f} | {f.p99_after_s:.1f} | "
            f"{_alerts_of(run, f, following, evaluated)} |"
        )
    lines += ["", "## Samples", "", _samples_table(run), "", "## RSS slopes between faults, after warm-up", ""]
    for name, pid, slope, span in rss_slopes(run, args.warmup_min):
        judged = f"{slope:+.2f} MB/h over {span:.0f} min" if slope is not None else f"not judged ({span:.0f} min)"
        lines.append(f"- {name} (pid {pid}): {judged}")
    lines += ["", "## RSS steps at each fault (MB; - where the process restarted)", "", _steps_table(run)]
    lines += ["", "## Alerts", ""]
    if evaluated.missing:
        lines.append(f"Not evaluated: {evaluated.missing}. TODO: evaluate the rules once they and promtool are here.")
    elif not evaluated.spans:
        lines.append("None fired.")
    for name, spans in evaluated.spans.items():
        when = ", ".join(f"{_min(run, s):.1f}-{_min(run, e) if e else math.inf:.1f}" for s, e in spans)
        lines.append(f"- {name}: {when} min")
    return "\n".join(lines) + "\n", not problems


def _steps_table(run: Run) -> str:
    head = ["process", *(f"{_min(run, f.at):.0f} {f.kind}" for f in run.injected)]
    out = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(run.injected)]
    for name, steps in rss_steps(run):
        out.append(f"| {name} | " + " | ".join("-" if d is None else f"{d:+.0f}" for d in steps) + " |")
    return "\n".join(out)


def _samples_table(run: Run) -> str:
    keys = ("requests", "replies", "lost", "duplicated", "duplicate_side_effects", "dead_letters", "ledger_rows", "lag")
    names = sorted({n for s in run.samples for n in s.per_service if n.split("-")[0] in topology.names()})
    head = ["min", *keys, *(f"{n} MB/fd/db" for n in names)]
    out = ["| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for s in run.samples:
        cells = [f"{s.at_min:.1f}", *(f"{s.totals.get(k, math.nan):.0f}" for k in keys)]
        for n in names:
            f = s.per_service.get(n)
            cells.append(f"{f['rss_mb']:.0f}/{f['fds']:.0f}/{f['db_conns']:.0f}" if f else "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot(run: Run, path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'): no plot"
    xs = [s.at_min for s in run.samples]
    fig, axes = plt.subplots(2, 3, figsize=(15, 7))
    names = sorted({n for s in run.samples for n in s.per_service})
    for ax, figure in zip(axes[0], ("rss_mb", "fds", "db_conns"), strict=True):
        for name in names:
            ax.plot(xs, [s.per_service.get(name, {}).get(figure, math.nan) for s in run.samples], label=name)
        ax.set_title(figure)
    axes[0][0].legend(fontsize=7)
    groups = (
        ("requests, replies", ("requests", "replies")),
        ("ledger rows, lag", ("ledger_rows", "lag")),
        ("lost, duplicated, dead letters", ("lost", "duplicated", "duplicate_side_effects", "dead_letters")),
    )
    for ax, (title, keys) in zip(axes[1], groups, strict=True):
        for key in keys:
            ax.plot(xs, [s.totals.get(key, math.nan) for s in run.samples], label=key)
        ax.set_title(title)
        ax.legend(fontsize=7)
    for ax in axes.flat:
        ax.set_xlabel("minutes")
        for f in run.injected:
            ax.axvspan(_min(run, f.at), max(_min(run, f.until), _min(run, f.at) + 0.05), color="red", alpha=0.15)
    fig.suptitle("faults shaded red")
    fig.tight_layout()
    fig.savefig(path)
    return f"plot written to {path}"
