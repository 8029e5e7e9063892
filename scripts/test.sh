#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite: unit, integration (real Kafka, real
# PostgreSQL) and e2e (the fleet as processes). Exit code is pytest's.
# Usage: scripts/test.sh [pytest args]      e.g. scripts/test.sh tests/integration -x
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
echo "==> pytest"
exec .venv/bin/python -m pytest -q "$@"
