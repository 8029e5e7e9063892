"""The faulted soak's pure parts (tests/benchmarks/bench_faulted.py, alerts.py, faulted_report.py): its schedule, its
`--faults` parsing, the promtool test file it writes from scraped series and how promtool's answer becomes the spans
an alert fired over."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import yaml

from tests.benchmarks import alerts, bench_faulted, faulted_report
from tests.benchmarks.alerts import Scrapes
from tests.benchmarks.bench_faulted import Injected, Run

# promtool test rules' failure lines as v0.316.0 (Prometheus 3.16) prints them for `exp_alerts: []` (each line of
# the first two parts ends in a space; a duration as Go prints it, its zero units dropped or not)
PROMTOOL_ANSWER = """Processing test file: soak-test.yaml
  FAILED:
    alertname: RoundtripTurnsStuck, time: 2m, \n        exp:[], \n        got:[
            0:
              Labels:{alertname="RoundtripTurnsStuck", severity="page"}
              Annotations:{summary="turns stuck"}
            ]
    alertname: RoundtripTurnsStuck, time: 3m, \n        exp:[], \n        got:[...]
    alertname: RoundtripDeadLetters, time: 1h, \n        exp:[], \n        got:[...]
    alertname: RoundtripTurnsStuck, time: 6m0s, \n        exp:[], \n        got:[...]
"""


def test_faults_land_mid_period_in_rotation_while_the_load_runs():
    assert bench_faulted.schedule(60, 600, list(bench_faulted.HOUR)) == [
        (300.0, "broker-kill"),
        (900.0, "postgres-kill"),
        (1500.0, "broker-stop"),
        (2100.0, "services-kill"),
        (2700.0, "shop-away"),
        (3300.0, "overload"),
    ]
    assert [k for _, k in bench_faulted.schedule(6, 120, ["a", "b"])] == ["a", "b", "a"]


@pytest.mark.parametrize(("spec", "seconds"), [("every:10m", 600), ("every:90s", 90), ("every:1h", 3600)])
def test_the_fault_period_is_read_from_every_n_unit(spec, seconds):
    assert bench_faulted.parse_faults(spec) == seconds


@pytest.mark.parametrize("spec", ["10m", "every:10", "every:xm", "every:0m", "often:10m"])
def test_a_bad_fault_period_is_one_line_naming_it(spec):
    with pytest.raises(SystemExit, match="--faults"):
        bench_faulted.parse_faults(spec)


def test_an_unknown_fault_is_refused_naming_the_known_ones():
    with pytest.raises(SystemExit, match="unknown fault 'flood'; known: broker-kill"):
        bench_faulted.parse(["--only", "broker-kill,flood"])


def test_the_promtool_file_holds_each_series_a_value_a_sample_and_asks_for_no_alert_at_each(tmp_path):
    scrapes = Scrapes({9000: "guard"}, times=[100.0, 160.0, 220.0])
    scrapes.series[("roundtrip_turns_total", (("instance", "127.0.0.1:9000"), ("outcome", 'a"b')))] = {0: 1.0, 2: 5.0}
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "g", "rules": [{"alert": "B", "expr": "1"}, {"record": "r", "expr": "1"}]}]}
        )
    )
    names = alerts.alert_names(rules)
    doc = alerts.promtool_tests(scrapes, rules, names, 60)
    assert names == ["B"]
    assert doc["rule_files"] == [str(rules.resolve())]
    test = doc["tests"][0]
    assert test["interval"] == "60s"
    assert test["input_series"] == [
        {"series": 'roundtrip_turns_total{instance="127.0.0.1:9000",outcome="a\\"b"}', "values": "1.0 _ 5.0"}
    ]
    assert [(c["eval_time"], c["alertname"], c["exp_alerts"]) for c in test["alert_rule_test"]] == [
        ("0s", "B", []),
        ("60s", "B", []),
        ("120s", "B", []),
    ]


def test_a_prometheus_rule_resources_alerts_are_read_from_its_spec(tmp_path):
    rules = tmp_path / "rule.yaml"
    rules.write_text(
        yaml.safe_dump(
            {"kind": "PrometheusRule", "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "1"}]}]}}
        )
    )
    assert alerts.alert_names(rules) == ["A"]


def test_promtools_answer_becomes_the_spans_each_alert_fired_and_when_it_cleared():
    fired = alerts.parse_fired(PROMTOOL_ANSWER)
    assert fired == [
        ("RoundtripTurnsStuck", 120.0),
        ("RoundtripTurnsStuck", 180.0),
        ("RoundtripDeadLetters", 3600.0),
        ("RoundtripTurnsStuck", 360.0),
    ]
    assert alerts.spans(fired, 1000.0, 61, 60, {}) == {
        "RoundtripDeadLetters": [(1000.0 + 3600, None)],  # still firing at the last evaluation
        "RoundtripTurnsStuck": [(1000.0 + 120, 1000.0 + 240), (1000.0 + 360, 1000.0 + 420)],
    }
    # a slot's sample taken late (the sampling drifts behind the grid) dates the span, not the grid
    late = {2: 1000.0 + 150, 4: 1000.0 + 275}
    assert alerts.spans(fired, 1000.0, 61, 60, late)["RoundtripTurnsStuck"][0] == (1000.0 + 150, 1000.0 + 275)


def test_samples_late_or_close_together_take_their_place_on_the_evaluation_grid(tmp_path):
    scrapes = Scrapes({9000: "guard"}, times=[0.0, 61.0, 125.0, 150.0, 185.0, 300.0])
    scrapes.series[("up", ())] = {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0, 4: 5.0, 5: 6.0}
    assert alerts.slots(scrapes.times, 60) == [0, 1, 2, 2, 3, 5]
    doc = alerts.promtool_tests(scrapes, tmp_path / "r.yaml", ["A"], 60)
    assert doc["tests"][0]["input_series"][0]["values"] == "1.0 2.0 4.0 5.0 _ 6.0"  # a later sample in a slot wins
    assert len(doc["tests"][0]["alert_rule_test"]) == 6


def test_without_a_rules_file_the_report_says_why_nothing_was_evaluated(tmp_path):
    evaluated = alerts.evaluate(Scrapes({}), tmp_path / "absent.yaml", 60)
    assert evaluated.missing.startswith("no rules file at") and not evaluated.spans


def test_p99_and_the_duplicate_side_effect_count():
    assert math.isnan(faulted_report.p99([]))
    assert faulted_report.p99([float(i) for i in range(1, 101)]) == 99.0
    assert faulted_report.p99([1.0, math.inf]) == math.inf  # a request left without a reply
    effects = [
        {"turn_id": "t1", "tool_use_id": "u1", "endpoint": "cancel_order", "order_id": "o1"},
        {"turn_id": "t1", "tool_use_id": "u1", "endpoint": "cancel_order", "order_id": "o1"},
        {"turn_id": "t2", "tool_use_id": "u2", "endpoint": "cancel_order", "order_id": "o1"},
        {"turn_id": "t3", "tool_use_id": "u3", "endpoint": "escalate", "order_id": None},
    ]
    assert faulted_report.duplicate_effects(effects) == 1 + 2


def test_the_scrapes_saved_beside_the_report_load_back_as_they_were(tmp_path):
    scrapes = Scrapes({9000: "guard", 9004: "executor"}, times=[100.0, 160.0])
    scrapes.series[("up", (("instance", "127.0.0.1:9000"), ("service", "guard")))] = {0: 1.0, 1: 0.5}
    scrapes.save(tmp_path / "m.json")
    again = Scrapes.load(tmp_path / "m.json")
    assert (again.targets, again.times, again.series) == (scrapes.targets, scrapes.times, scrapes.series)


def test_replies_flow_again_when_a_window_holds_half_the_offered_rate_not_at_a_trickle():
    trickle = [100.0, 140.0, 180.0]  # one reply every 40 s after the fault's end at 90
    steady = [200.0 + 0.5 * i for i in range(40)]  # 2 a second from 200 on
    assert faulted_report.flowing_after(trickle + steady, 90.0, need=10) == 115.0  # [195, 205] holds 200 to 205
    assert faulted_report.flowing_after(trickle, 90.0, need=10) == math.inf
    assert faulted_report.flowing_after([], 90.0, need=1) == math.inf


def test_rss_is_judged_between_faults_a_faults_step_is_reported_and_a_leak_still_breaks_the_bound():
    """A process that steps up 50 MB at a fault and stays flat holds the bound (its step is reported); one that grows
    between the faults breaks it."""
    run = Run(started_epoch=0.0)
    run.injected = [Injected("shop-away", [], at=20 * 60.0, until=21 * 60.0)]
    minutes = [float(m) for m in range(1, 41)]
    run.pids = {
        "gate": [(1, m, 120.0 + (50.0 if m >= 20 else 0.0)) for m in minutes],  # a high-water mark at the fault
        "guard": [(2, m, 120.0 + m / 6) for m in minutes],  # 10 MB/h, all along
    }
    slopes = {name: slope for name, _, slope, _ in faulted_report.rss_slopes(run, warmup_min=10)}
    assert slopes["gate"] == pytest.approx(0.0) and slopes["guard"] == pytest.approx(10.0)
    assert dict(faulted_report.rss_steps(run))["gate"] == [50.0]
    args = SimpleNamespace(warmup_min=10)
    assert [p for p in faulted_report.broken(run, args) if "RSS" in p] == [
        "guard (pid 2): RSS +10.0 MB/h between faults after its first 10 min"
    ]
