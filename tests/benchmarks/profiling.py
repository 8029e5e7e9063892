"""Where the time goes: CPU per process (from /proc) and per-hop latency (from the span file)."""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads), or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15 of stat)


@dataclass
class CpuMeter:
    """CPU seconds spent by named processes between start() and stop()."""

    pids: dict[str, int]

    def start(self) -> None:
        self._before = {name: cpu_seconds(pid) or 0.0 for name, pid in self.pids.items()}

    def stop(self) -> dict[str, float]:
        return {name: max(0.0, (cpu_seconds(pid) or 0.0) - self._before[name]) for name, pid in self.pids.items()}


def machine_cpu_seconds() -> float:
    """CPU seconds (user+nice+system+irq+softirq+steal) of the whole machine since boot."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICKS


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def read_spans(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    spans = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            spans.append(json.loads(line))
        except ValueError:
            continue
    return spans


def hop_profile(spans: list[dict], since_ns: int = 0, until_ns: int | None = None) -> dict[str, dict[str, float]]:
    """Per topic: Kafka hop latency (producer span start -> consumer span start) and handler time.

    FastStream's telemetry middleware writes a PRODUCER span ("<topic> publish") in the sending
    service and a CONSUMER span ("<topic> process") in the receiving one, under the turn span and
    linked to that producer span; the consumer span lasts as long as the handler (including its
    own publish).
    """
    spans = [s for s in spans if since_ns <= (s.get("start_ns") or 0) <= (until_ns or 1 << 63)]
    by_id = {s["span_id"]: s for s in spans}
    hop: dict[str, list[float]] = defaultdict(list)
    handler: dict[str, list[float]] = defaultdict(list)
    publish: dict[str, list[float]] = defaultdict(list)
    for s in spans:
        topic = s.get("attributes", {}).get("messaging.destination.name") or s["name"].rsplit(" ", 1)[0]
        if s.get("kind") == "PRODUCER":
            publish[topic].append((s["end_ns"] - s["start_ns"]) / 1e6)
        if s.get("kind") != "CONSUMER":
            continue
        handler[topic].append((s["end_ns"] - s["start_ns"]) / 1e6)
        # the hop's cause: the producer span it links to (spans under the turn span), or its parent (older traces)
        causes = [by_id.get(i) for i in (*(s.get("links") or ()), s.get("parent_id") or "")]
        producer = next((c for c in causes if c is not None and c.get("kind") == "PRODUCER"), None)
        if producer is not None:
            hop[topic].append((s["start_ns"] - producer["start_ns"]) / 1e6)
    out: dict[str, dict[str, float]] = {}
    for topic in sorted(set(hop) | set(handler) | set(publish)):  # a topic only apps read has no consumer span
        out[topic] = {
            "n": len(handler[topic]),
            "published": len(publish[topic]),
            "hop_p50_ms": percentile(hop[topic], 0.5),
            "hop_p99_ms": percentile(hop[topic], 0.99),
            "handler_p50_ms": percentile(handler[topic], 0.5),
            "handler_p99_ms": percentile(handler[topic], 0.99),
            "publish_p50_ms": percentile(publish[topic], 0.5),
        }
    return out


def response_times(
    spans: list[dict], service: str = "roundtrip-model", topic: str = "turn.iterations"
) -> dict[str, list[int]]:
    """Per conversation: the start (ns) of each publish of a model response, in order.

    The same moment the Kafka timestamp of the iteration record gives, with nanoseconds instead
    of milliseconds (a record's timestamp is whole milliseconds: iteration times from them are
    integers, +-1 ms each)."""
    out: dict[str, list[int]] = defaultdict(list)
    for s in spans:
        if s.get("kind") == "PRODUCER" and s.get("service") == service and s["name"] == f"{topic} publish":
            out[s.get("attributes", {}).get("messaging.kafka.message.key", "")].append(s["start_ns"])
    return {k: sorted(v) for k, v in out.items()}


def named_span_profile(
    spans: list[dict], since_ns: int = 0, until_ns: int | None = None
) -> dict[str, dict[str, float]]:
    """p50 duration of the handlers' own (INTERNAL/CLIENT) spans, by service and name."""
    durations: dict[str, list[float]] = defaultdict(list)
    for s in spans:
        if not since_ns <= (s.get("start_ns") or 0) <= (until_ns or 1 << 63) or s.get("kind") in (
            "PRODUCER",
            "CONSUMER",
        ):
            continue
        durations[f"{s.get('service')}: {s['name']}"].append((s["end_ns"] - s["start_ns"]) / 1e6)
    return {
        k: {"n": len(v), "p50_ms": statistics.median(v), "p99_ms": percentile(v, 0.99)}
        for k, v in sorted(durations.items())
    }


# -- sampling profiles of the services (optional: needs py-spy, not a project dependency) ---------

PACKAGES = (
    "faststream",
    "aiokafka",
    "opentelemetry",
    "pydantic",
    "pydantic_core",
    "anthropic",
    "httpx2",
    "httpx",
    "httpcore",
    "h11",
    "sqlalchemy",
    "aiosqlite",
    "sqlite3",
    "jsonschema",
    "logging",
    "json",
    "uvicorn",
    "starlette",
    "selectors",
)


def _package_of(frame: str) -> str | None:
    """py-spy raw frames look like 'function (path/to/module.py:123)'."""
    path = "/" + frame.rsplit("(", 1)[-1]  # py-spy shortens paths to "package/module.py:line"
    for pkg in PACKAGES:
        if f"/{pkg}/" in path or f"/{pkg}.py" in path:
            return pkg
    return None


def py_spy_summary(path: Path, top: int = 8) -> tuple[int, list[tuple[str, float]]]:
    """(samples, [(library, % of samples)]): each sample goes to the innermost frame of a known
    library ('selectors' is the event loop waiting; 'own code/stdlib' is everything else)."""
    if not path.is_file():
        return 0, []
    total = 0
    counts: dict[str, int] = defaultdict(int)
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        frames = stack.split(";")  # outermost first
        owner = next((pkg for f in reversed(frames) if (pkg := _package_of(f))), "own code/stdlib")
        counts[owner] += int(n)
    ranked = sorted(((k, 100 * v / total) for k, v in counts.items()), key=lambda kv: -kv[1]) if total else []
    return total, ranked[:top]
