"""Writes roundtrip-prometheusrule.yaml (a PrometheusRule for the Prometheus Operator) from roundtrip-rules.yaml.

    python deploy/prometheus/prometheusrule.py          # rewrite the manifest
    python deploy/prometheus/prometheusrule.py --check  # exit 1 if the committed manifest differs

The plain rules file is the one to edit: promtool checks and tests it (deploy/prometheus/tests).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "roundtrip-rules.yaml"
MANIFEST = HERE / "roundtrip-prometheusrule.yaml"
HEADER = (
    "# Generated from roundtrip-rules.yaml by `python deploy/prometheus/prometheusrule.py`: edit that file, not this.\n"
    "# kube-prometheus-stack selects rules by the label `release` (its Helm release's name by default): set it to\n"
    "# yours, or apply with kubectl and adjust ruleSelector. Runbooks: docs/operating/alerts.md.\n"
)


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions stay literal blocks, as in the rules file."""


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _string)


def manifest(rules_text: str) -> str:
    groups = yaml.safe_load(rules_text)["groups"]
    document = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "roundtrip",
            "namespace": "roundtrip",
            "labels": {"app.kubernetes.io/part-of": "roundtrip", "release": "kube-prometheus-stack"},
        },
        "spec": {"groups": groups},
    }
    return HEADER + yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=200, allow_unicode=True)


def main(argv: list[str]) -> int:
    wanted = manifest(RULES.read_text())
    if "--check" in argv:
        if MANIFEST.read_text() != wanted:
            print(f"{MANIFEST.name} differs from {RULES.name}: run python deploy/prometheus/prometheusrule.py")
            return 1
        return 0
    MANIFEST.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
