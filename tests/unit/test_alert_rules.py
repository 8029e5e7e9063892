"""The on-call engineer's box agrees with itself and with the fleet: the PrometheusRule holds the plain rules file's
groups, the committed dashboard is its generator's output, every metric a rule or a panel queries is one the fleet
exports, and every alert has its runbook (docs/operating/alerts.md) that its runbook_url points at. promtool's own
check and tests of the rules: tests/integration/test_alert_rules.py."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import yaml
from prometheus_client import REGISTRY

from roundtrip._kernel.kafka.faststream_metrics import KafkaMetrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "roundtrip-rules.yaml"
RUNBOOKS = ROOT / "docs" / "operating" / "alerts.md"
METRIC = re.compile(r"\b((?:roundtrip|faststream)_[a-z_]+)")


def script(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def exported() -> set[str]:
    """Every sample name the fleet's metrics expose (a counter's _total, a histogram's _bucket/_count/_sum)."""
    KafkaMetrics("alert-rules-test")  # FastStream's faststream_* metrics exist once a service has them
    names = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        names.update(f"{family.name}{suffix}" for suffix in ("_total", "_bucket", "_count", "_sum"))
    return names


def test_the_prometheusrule_holds_exactly_the_rules_files_groups():
    manifest = yaml.safe_load((RULES.parent / "roundtrip-prometheusrule.yaml").read_text())
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1" and manifest["kind"] == "PrometheusRule"
    assert manifest["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    generator = script(RULES.parent / "prometheusrule.py")
    assert generator.main(["--check"]) == 0, "run: python deploy/prometheus/prometheusrule.py"


def test_the_committed_dashboard_is_its_generators_output():
    generator = script(ROOT / "deploy" / "grafana" / "dashboard.py")
    assert (ROOT / "deploy" / "grafana" / "roundtrip.json").read_text() == generator.rendered(), (
        "run: python deploy/grafana/dashboard.py"
    )


def test_every_rule_and_panel_queries_metrics_the_fleet_exports():
    names = exported()
    queried = {m for rule in alerts() for m in METRIC.findall(rule["expr"])}
    queried |= set(METRIC.findall((ROOT / "deploy" / "grafana" / "roundtrip.json").read_text()))
    assert "roundtrip_reply_seconds_bucket" in queried and "roundtrip_consumer_lag" in queried
    assert not queried - names, f"queried but not exported: {sorted(queried - names)}"


def test_every_alert_has_its_runbook_with_three_first_steps_and_its_runbook_url_points_at_it():
    page = RUNBOOKS.read_text()
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", page, flags=re.M | re.S))
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names)) >= 8
    for rule in alerts():
        name = rule["alert"]
        assert name in sections, f"docs/operating/alerts.md has no section ## {name}"
        steps = re.findall(r"^(\d)\. ", sections[name], flags=re.M)
        assert steps == ["1", "2", "3"], f"{name}: its runbook lists the first three things to do"
        assert rule["annotations"]["runbook_url"] == f"operating/alerts/#{name.lower()}"  # the heading's anchor
        assert rule["labels"]["severity"] in ("warning", "critical")
    assert set(sections) == set(names), f"runbooks of no alert: {sorted(set(sections) - set(names))}"
