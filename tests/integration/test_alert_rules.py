"""The alert rules (deploy/prometheus/roundtrip-rules.yaml) through Prometheus's own promtool, the binary
`bash scripts/promtool.sh build` caches (scripts/test.sh and so .ci/run build it): `promtool check rules` accepts
them, `promtool test rules` passes deploy/prometheus/tests, which hold for every alert a case where it fires and one
where it does not, and those tests fail when a rule's threshold moves. Without the binary the tests are skipped,
which fails a CI run (tests/ci_skips.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "roundtrip-rules.yaml"
TESTS = sorted((PROMETHEUS / "tests").glob("*.yaml"))


@pytest.fixture(scope="module")
def promtool() -> str:
    found = subprocess.run(
        ["bash", str(ROOT / "scripts" / "promtool.sh"), "path"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        pytest.skip("promtool not built; run: bash scripts/promtool.sh build")
    return found.stdout.strip()


def run(promtool: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False)


def alert_names() -> list[str]:
    return [rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules(promtool):
    checked = run(promtool, "check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in checked.stdout


def test_promtool_tests_pass_and_each_alert_is_tested_firing_and_not_firing(promtool):
    tested = run(promtool, "test", "rules", *map(str, TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    cases: dict[str, set[bool]] = {}
    for path in TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    for name in alert_names():
        assert cases.get(name) == {True, False}, f"{name}: deploy/prometheus/tests needs a firing and a quiet case"


@pytest.mark.parametrize(
    ("rule", "moved"),
    [
        ("sum(increase(roundtrip_stuck_turns_total[10m])) > 5", "sum(increase(roundtrip_stuck_turns_total[10m])) > 50"),
        ("max(roundtrip_approval_oldest_wait_seconds) > 600", "max(roundtrip_approval_oldest_wait_seconds) > 900"),
        ("unavailable) > 0\n        for: 1m", "unavailable) > 0\n        for: 5m"),
    ],
)
def test_the_tests_fail_when_a_rule_changes(promtool, tmp_path, rule, moved):
    text = RULES.read_text()
    assert rule in text
    shutil.copytree(PROMETHEUS / "tests", tmp_path / "tests")
    (tmp_path / RULES.name).write_text(text.replace(rule, moved))
    tested = run(promtool, "test", "rules", *(str(tmp_path / "tests" / p.name) for p in TESTS))
    assert tested.returncode != 0 and "FAILED" in tested.stdout + tested.stderr
