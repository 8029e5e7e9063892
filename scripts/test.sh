#!/usr/bin/env bash
# Sets up (scripts/setup.sh), runs the gates (scripts/gates.sh: ruff and mypy; a finding fails the run), builds the
# manual (mkdocs, strict), builds the real Jaeger v2 and promtool once if missing (scripts/jaeger.sh and
# scripts/promtool.sh, cached), and runs the whole test suite: unit, integration (real Kafka, real PostgreSQL), e2e
# (the fleet as processes, a real Jaeger) and chaos.
# Usage: scripts/test.sh                  the whole suite, as three pytest runs side by side (below)
#        scripts/test.sh [pytest args]    one pytest run, e.g. scripts/test.sh tests/integration -x
# Exit code: pytest's (including 5, "no tests collected"); of the three runs, the first that failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh

# The real Jaeger v2 for the tracing e2e tests (tests/e2e/test_jaeger_e2e.py): built once from its Go module
# into ~/.cache/roundtrip (about 4 min on 2 cores, cold). Without a usable Go the tests are skipped, loudly.
if ! bash scripts/jaeger.sh path >/dev/null 2>&1; then
  if why=$(bash scripts/jaeger.sh check-go); then
    bash scripts/jaeger.sh build >/dev/null
  else
    export ROUNDTRIP_JAEGER_UNAVAILABLE="$why"
    echo "==> WARNING: Jaeger v2 cannot be built here ($why): the Jaeger e2e tests will be SKIPPED" >&2
  fi
fi

# promtool, Prometheus's rule checker, for the alert rules' tests (tests/integration/test_alert_rules.py): built once
# from its Go module into ~/.cache/roundtrip like Jaeger. Without it those tests skip, which fails a CI run.
if ! bash scripts/promtool.sh path >/dev/null 2>&1; then
  if why=$(bash scripts/promtool.sh check-go); then
    bash scripts/promtool.sh build >/dev/null
  else
    echo "==> WARNING: promtool cannot be built here ($why): the alert rules' tests will be SKIPPED (a failure in CI)" >&2
  fi
fi

bash scripts/gates.sh  # ruff (lint, format) and mypy: a finding fails the run before any test

echo "==> the manual: mkdocs build --strict (a broken link or a page outside the navigation fails)"
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"

if [ $# -gt 0 ]; then
  echo "==> pytest $*"
  exec .venv/bin/python -m pytest -q -rs "$@"
fi

# The whole suite as three pytest runs side by side: most of an e2e or chaos test is waiting (for a simulated model's
# latency, a deadline, a broker coming back), and the unit tier is short and busy, so three runs on two cores take
# about the time of the longest (integration and chaos). Each run has its own broker, fleet and temporary folders
# (every port is a free one), so they share nothing.
# -rs lists every skip with its reason, --durations the slowest tests (to balance the runs); in CI (CI=true) a skip
# fails the run but the Jaeger tests' when Go is unusable (tests/ci_skips.py).
# The first run reports here as it goes; the others write their logs, shown when they end.
runs=("tests/integration tests/chaos" "tests/e2e" "tests/unit")
work=$(mktemp -d -t roundtrip-tests.XXXXXX)  # each run's own --basetemp and log
started=$SECONDS
echo "==> pytest, three runs side by side: [${runs[0]}] here, [${runs[1]}] and [${runs[2]}] into $work (shown when they end)"
pids=()
for i in 1 2; do
  # shellcheck disable=SC2086  # each run is a list of folders
  .venv/bin/python -m pytest -q -rs --durations=15 -p no:cacheprovider --basetemp "$work/run$i" ${runs[$i]} >"$work/run$i.log" 2>&1 &
  pids+=($!)
done
set +e
# shellcheck disable=SC2086
.venv/bin/python -m pytest -q -rs --durations=15 -p no:cacheprovider --basetemp "$work/run0" ${runs[0]}
rc=$?
echo "==> [${runs[0]}] exited $rc after $((SECONDS - started)) s"
for i in 1 2; do
  wait "${pids[$((i - 1))]}"
  run_rc=$?
  echo "==> [${runs[$i]}] exited $run_rc after $((SECONDS - started)) s; its output:"
  cat "$work/run$i.log"
  [ "$rc" -eq 0 ] && rc=$run_rc
done
set -e
exit "$rc"
