"""Writes roundtrip.json, the fleet's Grafana dashboard, with grafana-foundation-sdk (in the `test` extra).

    python deploy/grafana/dashboard.py          # rewrite the dashboard
    python deploy/grafana/dashboard.py --check  # exit 1 if the committed dashboard differs

Every query reads metrics the fleet exports (docs/operating/index.md); the alerts: docs/operating/alerts.md. The row
"Agent versions side by side" compares the versions a fleet runs (docs/operating/agent-versions.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardLinkType, DataSourceRef, VariableOption

OUT = Path(__file__).resolve().parent / "roundtrip.json"
PROMETHEUS = DataSourceRef(type_val="prometheus", uid="${datasource}")
# the turn's trace by an exemplar's trace id (roundtrip_reply_seconds carries one per bucket), and Jaeger's searches
TRACE = "${jaeger}/trace/${__data.fields.trace_id}"
SLOWER = "${jaeger}/search?service=roundtrip-gateway&minDuration=${__value.raw}s"
SEARCH = (
    "${jaeger}/search?service=roundtrip-gateway&tags=%7B%22roundtrip.outcome%22%3A%22${__field.labels.outcome}%22%7D"
)
DEAD_LETTERS = 'destination=~"(.+\\\\.)?roundtrip\\\\.dead_letters\\\\.by\\\\..+"'
VERSION_SEARCH = (
    "${jaeger}/search?service=roundtrip-gateway&tags=%7B%22roundtrip.agent.version%22%3A%22"
    "${__field.labels.agent_version}%22%2C%22roundtrip.outcome%22%3A%22${__field.labels.outcome}%22%7D"
)
# a rate per agent version and outcome over the version's own: its outcome mix, comparable whatever its share
MIX = (
    "sum by (agent_version, outcome) (rate(roundtrip_turns_total[$__rate_interval]))"
    " / on (agent_version) group_left sum by (agent_version) (rate(roundtrip_turns_total[$__rate_interval]))"
)


def query(expr: str, legend: str, exemplar: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend).range()
    return q.exemplar(True) if exemplar else q


def series(title: str, unit: str, *queries: prometheus.Dataquery, width: int = 12) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).datasource(PROMETHEUS).unit(unit).height(8).span(width)
    for n, q in enumerate(queries):
        panel = panel.with_target(q.ref_id(chr(ord("A") + n)))
    return panel


def number(title: str, expr: str, unit: str, description: str) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .unit(unit)
        .height(4)
        .span(6)
        .with_target(query(expr, title).instant().ref_id("A"))
    )


def build() -> dashboard.Dashboard:
    jaeger = (
        dashboard.TextBoxVariable("jaeger")
        .label("Jaeger")
        .description("Jaeger's UI, for the links to a turn's trace")
        .default_value("http://localhost:16686")
        .current(VariableOption(text="http://localhost:16686", value="http://localhost:16686"))
    )
    turns_by_outcome = series(
        "Turns ended, by outcome",
        "ops",
        query("sum by (outcome) (rate(roundtrip_turns_total[$__rate_interval]))", "{{outcome}}"),
    ).data_links([dashboard.DashboardLink("Turns of this outcome in Jaeger").url(SEARCH).target_blank(True)])
    reply_latency = series(
        "Reply latency (request to reply) by lane: p50, p95, p99",
        "s",
        *(
            query(
                f"histogram_quantile({q}, sum by (le, lane) (rate(roundtrip_reply_seconds_bucket[$__rate_interval])))",
                f"p{round(q * 100)} {{{{lane}}}}",
                exemplar=True,
            )
            for q in (0.5, 0.95, 0.99)
        ),
    ).data_links(
        [
            dashboard.DashboardLink("The turn's trace in Jaeger (an exemplar)").url(TRACE).target_blank(True),
            dashboard.DashboardLink("Turns at least this slow in Jaeger").url(SLOWER).target_blank(True),
        ]
    )
    return (
        dashboard.Dashboard("roundtrip")
        .uid("roundtrip-fleet")
        .description(
            "The fleet's turns, replies, agent versions, lag, model calls, approvals and dead letters (deploy/grafana)"
        )
        .tags(["roundtrip"])
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(jaeger)
        .link(
            dashboard.DashboardLink("Jaeger: the gateway's turns")
            .type(DashboardLinkType.LINK)
            .url("${jaeger}/search?service=roundtrip-gateway")
            .target_blank(True)
        )
        .with_row(dashboard.Row("Now"))
        .with_panel(
            number(
                "Turns stuck (10 min)",
                "sum(increase(roundtrip_stuck_turns_total[10m]))",
                "short",
                "Turns the guard flagged stuck over 10 minutes (alert RoundtripTurnsStuck)",
            )
        )
        .with_panel(
            number(
                "Approvals waiting",
                "max(roundtrip_approvals_waiting)",
                "short",
                "Tool calls waiting for a person's decision (the guard's ledger pass, every minute)",
            )
        )
        .with_panel(
            number(
                "Oldest approval's wait",
                "max(roundtrip_approval_oldest_wait_seconds)",
                "s",
                "Alert RoundtripApprovalsWaiting past 10 minutes",
            )
        )
        .with_panel(
            number(
                "Dead letters (1 h)",
                f'sum(increase(faststream_published_messages_total{{{DEAD_LETTERS}, status="success"}}[1h]))',
                "short",
                "Records dead-lettered over the last hour: roundtrip dead-letters, or the console",
            )
        )
        .with_row(dashboard.Row("Turns and replies"))
        .with_panel(turns_by_outcome)
        .with_panel(reply_latency)
        .with_panel(
            series(
                "Turns flagged stuck and ended at their deadline",
                "ops",
                query("sum(rate(roundtrip_stuck_turns_total[$__rate_interval]))", "flagged stuck"),
                query('sum(rate(roundtrip_turns_total{outcome="deadline"}[$__rate_interval]))', "ended: deadline"),
            )
        )
        .with_panel(
            series(
                "One step of the loop: p50, p95",
                "s",
                *(
                    query(
                        f"histogram_quantile({q}, sum by (le) (rate(roundtrip_step_seconds_bucket[$__rate_interval])))",
                        f"p{round(q * 100)}",
                    )
                    for q in (0.5, 0.95)
                ),
            )
        )
        .with_row(dashboard.Row("Agent versions side by side"))
        .with_panel(
            series(
                "Outcome mix per agent version (of its own turns)",
                "percentunit",
                query(MIX, "{{agent_version}}: {{outcome}}"),
                width=8,
            ).data_links(
                [
                    dashboard.DashboardLink("This version's turns of this outcome in Jaeger")
                    .url(VERSION_SEARCH)
                    .target_blank(True)
                ]
            )
        )
        .with_panel(
            series(
                "Turns ended per agent version",
                "ops",
                query("sum by (agent_version) (rate(roundtrip_turns_total[$__rate_interval]))", "{{agent_version}}"),
                width=8,
            )
        )
        .with_panel(
            series(
                "Reply latency per agent version: p50, p95",
                "s",
                *(
                    query(
                        f"histogram_quantile({q}, sum by (le, agent_version) "
                        "(rate(roundtrip_reply_seconds_bucket[$__rate_interval])))",
                        f"{{{{agent_version}}}} p{round(q * 100)}",
                    )
                    for q in (0.5, 0.95)
                ),
                width=8,
            )
        )
        .with_row(dashboard.Row("Kafka"))
        .with_panel(
            series(
                "Consumer lag, per group and topic",
                "short",
                query("sum by (consumer, topic) (roundtrip_consumer_lag)", "{{consumer}} {{topic}}"),
            )
        )
        .with_panel(
            series(
                "Dead letters, per service",
                "short",
                query(
                    f"sum by (app_name) (increase(faststream_published_messages_total{{{DEAD_LETTERS}, "
                    'status="success"}[$__rate_interval]))',
                    "{{app_name}}",
                ),
            )
        )
        .with_panel(
            series(
                "Dependencies waited for (1: partitions paused)",
                "short",
                query(
                    "max by (consumer, dependency) (roundtrip_dependency_unavailable)", "{{consumer}}: {{dependency}}"
                ),
            )
        )
        .with_panel(
            series(
                "Messages handled per second, per service",
                "ops",
                query(
                    "sum by (app_name) (rate(faststream_received_processed_messages_total[$__rate_interval]))",
                    "{{app_name}}",
                ),
            )
        )
        .with_row(dashboard.Row("The model and the approvals"))
        .with_panel(
            series(
                "Model calls and 429/529 answers",
                "ops",
                query(
                    "sum by (result) (rate(roundtrip_model_call_duration_seconds_count[$__rate_interval]))",
                    "calls: {{result}}",
                ),
                query("sum(rate(roundtrip_model_refusals_total[$__rate_interval]))", "429/529 answers"),
            )
        )
        .with_panel(
            series(
                "Model calls waiting for capacity, and the pace",
                "short",
                query("sum(roundtrip_model_waiting)", "waiting"),
                query("sum(roundtrip_model_rate_limit)", "calls/s allowed"),
            )
        )
        .with_panel(
            series(
                "Approvals waiting, and the oldest one's wait",
                "short",
                query("max(roundtrip_approvals_waiting)", "waiting"),
                query("max(roundtrip_approval_oldest_wait_seconds) / 60", "oldest wait (min)"),
            )
        )
        .with_panel(
            series(
                "Tool calls run, by result",
                "ops",
                query("sum by (result) (rate(roundtrip_tool_executions_total[$__rate_interval]))", "{{result}}"),
            )
        )
    )


def rendered() -> str:
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    if "--check" in argv:
        if OUT.read_text() != rendered():
            print(f"{OUT.name} differs from its generator: run python deploy/grafana/dashboard.py")
            return 1
        return 0
    OUT.write_text(rendered())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
