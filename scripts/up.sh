#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and starts the whole fleet on this machine with the embedded defaults:
# Apache Kafka (KRaft), the Messages API simulator (unless ANTHROPIC_API_KEY is set), the demo shop
# and the five services. Ctrl-C stops everything. Extra arguments go to `roundtrip up`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec .venv/bin/roundtrip up "$@"
