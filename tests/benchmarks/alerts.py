"""The fleet's alert rules evaluated over what a soak scraped: which alerts fired, and when they cleared.

Every sample scrapes each service's /metrics (`Scrapes.scrape`, labelled `instance` by port and `service`). At the end
`evaluate` writes the series as the input of a `promtool test rules` file (one value a sample interval, `_` where a
process did not answer) and asks, at every sample, for no alert of the rules file; promtool names each one that
fired anyway (`alertname: X, time: 5m0s`). So the rules are evaluated by Prometheus's own engine (`for:`, rates over
counter resets), at the sample interval's resolution. The promtool binary: $ROUNDTRIP_PROMTOOL, else
`bash scripts/promtool.sh path`, else `promtool` on PATH.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
DEFAULT_RULES = REPO / "deploy" / "prometheus" / "roundtrip-rules.yaml"
FIRED = re.compile(r"alertname: (\S+), time: (\S+),")
Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class Scrapes:
    """Each sample's values of every series the fleet exported (name and labels -> value by sample index)."""

    targets: dict[int, str]  # port -> service
    times: list[float] = field(default_factory=list)  # epoch of each sample
    series: dict[Key, dict[int, float]] = field(default_factory=dict)

    async def scrape(self, at: float) -> int:
        """One sample of every target (those down are left out); returns how many answered."""
        index = len(self.times)
        self.times.append(at)
        async with httpx.AsyncClient(timeout=5) as http:
            texts = await asyncio.gather(*(_get(http, port) for port in self.targets), return_exceptions=True)
        answered = 0
        for (port, service), text in zip(self.targets.items(), texts, strict=True):
            if not isinstance(text, str):
                continue
            answered += 1
            extra = {"instance": f"127.0.0.1:{port}", "job": "roundtrip", "service": service}
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name.endswith("_created"):
                        continue  # a creation time, not a figure a rule reads
                    labels = tuple(sorted({**s.labels, **extra}.items()))
                    self.series.setdefault((s.name, labels), {})[index] = float(s.value)
        return answered

    def save(self, path: Path) -> None:
        """The scrapes as JSON, to evaluate other rules over them later (`python -m tests.benchmarks.alerts`)."""
        series = [{"name": n, "labels": dict(labels), "values": v} for (n, labels), v in self.series.items()]
        path.write_text(json.dumps({"targets": self.targets, "times": self.times, "series": series}))

    @classmethod
    def load(cls, path: Path) -> Scrapes:
        doc = json.loads(path.read_text())
        scrapes = cls({int(p): s for p, s in doc["targets"].items()}, times=doc["times"])
        for s in doc["series"]:
            key = (s["name"], tuple(sorted(s["labels"].items())))
            scrapes.series[key] = {int(i): float(v) for i, v in s["values"].items()}
        return scrapes


async def _get(http: httpx.AsyncClient, port: int) -> str:
    answer = await http.get(f"http://127.0.0.1:{port}/metrics")
    answer.raise_for_status()
    return answer.text


def promtool() -> str | None:
    if path := os.environ.get("ROUNDTRIP_PROMTOOL"):
        return path
    script = REPO / "scripts" / "promtool.sh"
    if script.exists():
        found = subprocess.run(["bash", str(script), "path"], capture_output=True, text=True, check=False)
        if found.returncode == 0 and found.stdout.strip():
            return found.stdout.strip().splitlines()[-1]
    return shutil.which("promtool")


def alert_names(rules: Path) -> list[str]:
    doc = yaml.safe_load(rules.read_text())
    if isinstance(doc, dict) and doc.get("kind") == "PrometheusRule":
        doc = doc.get("spec", {})
    return sorted({r["alert"] for g in (doc or {}).get("groups", []) for r in g.get("rules", []) if "alert" in r})


def _series_line(key: Key) -> str:
    name, labels = key
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return f"{name}{{{inner}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def slots(times: list[float], step_s: int) -> list[int]:
    """Each sample's place on the evaluation grid (step_s apart from the first sample): samples come a little late
    while a fault slows the sampler, and the drain's may come closer together; a later one in a slot wins."""
    return [round((t - times[0]) / step_s) for t in times] if times else []


def promtool_tests(scrapes: Scrapes, rules: Path, names: list[str], step_s: int) -> dict:
    """A `promtool test rules` document: the scraped series on the grid, and at every slot no alert expected."""
    at = slots(scrapes.times, step_s)
    n = at[-1] + 1 if at else 0
    input_series = []
    for key, v in sorted(scrapes.series.items()):
        values = {at[i]: value for i, value in sorted(v.items())}
        input_series.append(
            {"series": _series_line(key), "values": " ".join(repr(values[k]) if k in values else "_" for k in range(n))}
        )
    checks = [{"eval_time": f"{k * step_s}s", "alertname": name, "exp_alerts": []} for k in range(n) for name in names]
    return {
        "rule_files": [str(rules.resolve())],
        "evaluation_interval": f"{step_s}s",
        "tests": [{"interval": f"{step_s}s", "input_series": input_series, "alert_rule_test": checks}],
    }


def parse_fired(output: str) -> list[tuple[str, float]]:
    """(alert, seconds from the first sample) of each evaluation at which an alert fired, from promtool's output."""
    return [(name, _seconds(at)) for name, at in FIRED.findall(output)]


def _seconds(duration: str) -> float:
    """A Go duration as promtool prints it (`1h2m3s`, `5m0s`, `0s`) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)(ms|h|m|s)", duration))


@dataclass
class Evaluated:
    """Per alert, the spans (epoch from, epoch to or None while still firing at the last sample) it fired; or why
    the rules could not be evaluated (`missing`)."""

    spans: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)
    missing: str = ""


def evaluate(scrapes: Scrapes, rules: Path | None, step_s: int) -> Evaluated:
    rules = rules or DEFAULT_RULES
    if not rules.exists():
        return Evaluated(missing=f"no rules file at {rules}")
    binary = promtool()
    if binary is None:
        return Evaluated(missing="no promtool (bash scripts/promtool.sh build, or set ROUNDTRIP_PROMTOOL)")
    names = alert_names(rules)
    if not names or not scrapes.times:
        return Evaluated()
    with tempfile.TemporaryDirectory(prefix="roundtrip-alerts-") as tmp:
        path = Path(tmp) / "soak-test.yaml"
        path.write_text(yaml.safe_dump(promtool_tests(scrapes, rules, names, step_s), sort_keys=False))
        run = subprocess.run([binary, "test", "rules", str(path)], capture_output=True, text=True, check=False)
    fired = parse_fired(run.stdout + run.stderr)
    if run.returncode != 0 and not fired:
        return Evaluated(missing=f"promtool failed: {(run.stderr or run.stdout).strip()[:300]}")
    at = slots(scrapes.times, step_s)
    taken = dict(zip(at, scrapes.times, strict=True))  # a slot's time is its sample's (samples drift late of the grid)
    return Evaluated(spans=spans(fired, scrapes.times[0], at[-1] + 1, step_s, taken))


def spans(
    fired: list[tuple[str, float]], first: float, n: int, step_s: int, taken: dict[int, float]
) -> dict[str, list[tuple[float, float | None]]]:
    """Consecutive evaluations (of `n`, step_s apart from the epoch `first`) at which an alert fired, as (the first
    firing one's epoch, the first quiet one's, or None when it still fired at the last). An evaluation's epoch is
    when its sample was taken (`taken`, by slot), else its place on the grid."""

    def at(k: int) -> float:
        return taken.get(k, first + k * step_s)

    out: dict[str, list[tuple[float, float | None]]] = {}
    for name in sorted({name for name, _ in fired}):
        firing = sorted({round(seconds / step_s) for alert, seconds in fired if alert == name})
        runs: list[tuple[float, float | None]] = []
        for k in firing:
            if runs and k - 1 in firing:
                continue
            end = k
            while end + 1 in firing:
                end += 1
            runs.append((at(k), at(end + 1) if end + 1 < n else None))
        out[name] = runs
    return out


def main(argv: list[str] | None = None) -> int:
    """Evaluate a rules file over the metrics a faulted soak saved (its report's `-metrics.json`)."""
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.alerts", description=main.__doc__)
    parser.add_argument("metrics", type=Path, help="the -metrics.json a faulted soak wrote beside its report")
    parser.add_argument("--rules", type=Path, default=None, help="default deploy/prometheus/roundtrip-rules.yaml")
    parser.add_argument("--step-s", type=int, default=60, help="the soak's --sample-s (default 60)")
    args = parser.parse_args(argv)
    scrapes = Scrapes.load(args.metrics)
    evaluated = evaluate(scrapes, args.rules, args.step_s)
    if evaluated.missing:
        print(f"not evaluated: {evaluated.missing}")
        return 1
    start = scrapes.times[0] if scrapes.times else 0.0
    for name, runs in evaluated.spans.items():
        when = ", ".join(f"{(a - start) / 60:.1f}-{(b - start) / 60 if b else math.inf:.1f}" for a, b in runs)
        print(f"{name}: {when} min")
    if not evaluated.spans:
        print("no alert fired")
    return 0


if __name__ == "__main__":
    sys.exit(main())
