#!/usr/bin/env bash
# Sets up what the fleet and its tests need, idempotently (quick when already done):
#   1. .venv with the project (and its test extras), re-installed when pyproject.toml changes
#   2. the Apache Kafka jars, fetched once with mvn into ~/.cache/roundtrip (ROUNDTRIP_KAFKA_CACHE)
# Needs: python3 (>= 3.11, with venv), Java 17+, Maven; the tests also need PostgreSQL server binaries
# (Debian: apt-get install python3-venv openjdk-17-jre-headless maven postgresql; .ci/run does that).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $("$PYTHON" --version)"
  "$PYTHON" -m venv .venv
fi

stamp=.venv/.roundtrip-deps
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "==> installing the project and its test dependencies into .venv"
  .venv/bin/python -m pip install --disable-pip-version-check -q -e '.[test]'
  echo "$want" > "$stamp"
fi

echo "==> Apache Kafka jars"
.venv/bin/python -m services.broker.embedded fetch
