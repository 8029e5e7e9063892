#!/usr/bin/env bash
# The loop benchmark: the same scripted turns through the fleet (embedded Apache Kafka, real
# processes) and through a plain in-process loop, at 1 and at 50 concurrent turns.
#   1. scripts/setup.sh (.venv, the Kafka jars), then the '.[bench]' extra if it is missing
#      (matplotlib for the plot, which the benchmark skips when it cannot be installed; confluent-kafka
#      for bench_kafka_ring's comparison of Kafka clients)
#   2. .venv/bin/python -m tests.benchmarks.bench_loop [args]   (--help lists them)
# It starts everything it needs on free ports in a temporary folder, takes about four minutes,
# stops by itself and leaves no process behind. Figures and how to read them: docs/benchmarks.md.
# Usage: scripts/bench.sh [--turns N] [--turns-single N] [--concurrency 1,50] [--py-spy DIR] ...
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
if ! .venv/bin/python -c "import matplotlib, confluent_kafka" 2>/dev/null; then
  echo "==> installing the bench extra (matplotlib, confluent-kafka) into .venv"
  .venv/bin/python -m pip install --disable-pip-version-check -q -e '.[bench]' || echo "   (the bench extra could not be installed: no plot; bench_kafka_ring measures aiokafka alone)"
fi

echo "==> benchmark"
exec .venv/bin/python -W ignore::DeprecationWarning -m tests.benchmarks.bench_loop "$@"
