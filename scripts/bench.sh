#!/usr/bin/env bash
# The loop benchmark: the same scripted turns through the fleet (embedded Apache Kafka, real
# processes) and through a plain in-process loop, at 1 and at 50 concurrent turns.
#   1. scripts/setup.sh (.venv, the Kafka jars), then matplotlib for the plot if it is missing
#      (the '.[bench]' extra; the benchmark skips the plot when it cannot be installed)
#   2. .venv/bin/python -m tests.benchmarks.bench_loop [args]   (--help lists them)
# It starts everything it needs on free ports in a temporary folder, takes about four minutes,
# stops by itself and leaves no process behind. Figures and how to read them: docs/benchmarks.md.
# Usage: scripts/bench.sh [--turns N] [--turns-single N] [--concurrency 1,50] [--py-spy DIR] ...
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
if ! .venv/bin/python -c "import matplotlib" 2>/dev/null; then
  echo "==> installing the bench extra (matplotlib) into .venv"
  .venv/bin/python -m pip install --disable-pip-version-check -q -e '.[bench]' || echo "   (no matplotlib: the plot is skipped)"
fi

echo "==> benchmark"
exec .venv/bin/python -W ignore::DeprecationWarning -m tests.benchmarks.bench_loop "$@"
