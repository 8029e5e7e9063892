"""What a suite's results say: the table, the totals, the changes against a saved baseline, and JUnit XML for CI.

A baseline is a JSON file of each case's pass rate, most frequent outcome, tools called, mean steps and mean cost
(`--save-baseline`). Against one (`--baseline`), a case regresses when its pass rate drops or when a case the
baseline does not know fails; a change of outcome, of the tools called, of the steps or of the cost by more than
COST_CHANGE is said, not a regression by itself (the expectations of the case decide what must hold).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from xml.etree import ElementTree

from roundtrip._cli.evals.runner import CaseResult

COST_CHANGE = 0.2  # a relative change of a case's mean cost said as a change
BASELINE_VERSION = 1


def summary(result: CaseResult) -> dict[str, Any]:
    """A case's result as a baseline keeps it."""
    runs = result.runs
    outcomes = Counter(r.outcome for r in runs)
    return {
        "pass_rate": round(result.pass_rate, 4),
        "outcome": outcomes.most_common(1)[0][0] if outcomes else "",
        "tools": sorted({tool for r in runs for tool in r.tools}),
        "steps": round(sum(r.steps for r in runs) / len(runs), 2) if runs else 0,
        "cost_usd": round(sum(r.cost_usd for r in runs) / len(runs), 6) if runs else 0.0,
    }


def save_baseline(path: Path, results: list[CaseResult]) -> None:
    cases = {r.case.name: summary(r) for r in results if r.skipped is None}
    path.write_text(json.dumps({"version": BASELINE_VERSION, "cases": cases}, indent=2, sort_keys=True) + "\n")


def load_baseline(path: Path) -> dict[str, dict[str, Any]]:
    """The cases of a baseline file; ValueError with one line when it cannot be read."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"baseline {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cases"), dict):
        raise ValueError(f"baseline {path}: not a baseline (roundtrip eval run --save-baseline writes one)")
    return cast("dict[str, dict[str, Any]]", data["cases"])


@dataclass
class Change:
    case: str
    regression: bool
    said: str


def changes(results: list[CaseResult], baseline: dict[str, dict[str, Any]]) -> list[Change]:
    """What differs from the baseline, case by case (a regression or a change worth saying)."""
    found: list[Change] = []
    for result in results:
        name = result.case.name
        if result.skipped is not None:
            continue
        now, then = summary(result), baseline.get(name)
        if then is None:
            found.append(Change(name, not result.passed, "new case" + ("" if result.passed else ", failing")))
            continue
        if now["pass_rate"] < then.get("pass_rate", 0):
            found.append(Change(name, True, f"pass rate {then['pass_rate']:.0%} -> {now['pass_rate']:.0%}"))
        elif now["pass_rate"] > then.get("pass_rate", 0):
            found.append(Change(name, False, f"pass rate {then['pass_rate']:.0%} -> {now['pass_rate']:.0%}"))
        if then.get("outcome") != now["outcome"]:
            found.append(Change(name, False, f"outcome {then.get('outcome')} -> {now['outcome']}"))
        if sorted(then.get("tools", [])) != now["tools"]:
            gone, new = set(then.get("tools", [])) - set(now["tools"]), set(now["tools"]) - set(then.get("tools", []))
            said = ", ".join([*(f"+{t}" for t in sorted(new)), *(f"-{t}" for t in sorted(gone))])
            found.append(Change(name, False, f"tools {said}"))
        if then.get("steps") != now["steps"]:
            found.append(Change(name, False, f"steps {then.get('steps')} -> {now['steps']}"))
        before = float(then.get("cost_usd", 0.0))
        if before and abs(now["cost_usd"] - before) / before > COST_CHANGE:
            found.append(Change(name, False, f"cost ${before:.4f} -> ${now['cost_usd']:.4f}"))
    names = {r.case.name for r in results}
    found += [Change(name, False, "no longer in the suite") for name in sorted(set(baseline) - names)]
    return found


def totals(results: list[CaseResult]) -> dict[str, Any]:
    runs = [run for r in results for run in r.runs]
    return {
        "cases": len(results),
        "passed": sum(r.passed and r.skipped is None for r in results),
        "failed": sum(not r.passed for r in results),
        "skipped": sum(r.skipped is not None for r in results),
        "runs": len(runs),
        "cost_usd": sum(r.cost_usd for r in runs),
        "input_tokens": sum(r.input_tokens for r in runs),
        "output_tokens": sum(r.output_tokens for r in runs),
    }


def junit(results: list[CaseResult], suite: str) -> str:
    """JUnit XML: a testsuite of one testcase per case (a failure per failing case, with each failing run's
    reasons; skipped ones say why), its pass rate and cost as properties."""
    count = totals(results)
    root = ElementTree.Element(
        "testsuite",
        name=suite,
        tests=str(count["cases"]),
        failures=str(count["failed"]),
        skipped=str(count["skipped"]),
        errors="0",
        time=f"{sum(run.seconds for r in results for run in r.runs):.3f}",
    )
    for result in results:
        case = ElementTree.SubElement(
            root,
            "testcase",
            classname=f"roundtrip.eval.{suite}",
            name=result.case.name,
            file=str(result.case.path),
            time=f"{sum(run.seconds for run in result.runs):.3f}",
        )
        properties = ElementTree.SubElement(case, "properties")
        for key, value in summary(result).items():
            shown = ",".join(value) if isinstance(value, list) else str(value)
            ElementTree.SubElement(properties, "property", name=key, value=shown)
        if result.skipped is not None:
            ElementTree.SubElement(case, "skipped", message=result.skipped)
        elif not result.passed:
            failure = ElementTree.SubElement(
                case,
                "failure",
                message=f"pass rate {result.pass_rate:.0%}, at least {result.case.min_pass_rate:.0%} expected",
            )
            failure.text = "\n".join(
                f"run {i + 1} ({run.conversation}): {reason}"
                for i, run in enumerate(result.runs)
                for reason in run.failures
            )
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"
