#!/usr/bin/env bash
# Sets up what the fleet and its tests need, idempotently (quick when already done):
#   1. .venv with the project (and its test extras), re-installed when pyproject.toml changes; and the example agent
#      examples/telecom-agent as its own distribution (not editable: as a user's agent package would be), re-installed
#      when any of its files changes (tests/e2e/test_own_agent_e2e.py runs the fleet with it)
#   2. the Apache Kafka jars, fetched once with mvn into ~/.cache/roundtrip (ROUNDTRIP_KAFKA_CACHE)
# Needs: python3 (>= 3.11, with venv), Java 17+, Maven; the tests also need PostgreSQL server binaries
# (Debian: apt-get install python3-venv openjdk-17-jre-headless maven postgresql; .ci/run does that).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/saying.sh

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $("$PYTHON" --version)"
  "$PYTHON" -m venv .venv
fi

stamp=.venv/.roundtrip-deps
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "==> installing the project, its test and docs dependencies into .venv"
  saying "installing with pip (a minute or two the first time)" \
    .venv/bin/python -m pip install --disable-pip-version-check -q -e '.[test,docs]'
  echo "$want" > "$stamp"
fi

stamp=.venv/.roundtrip-example-agent
want=$(find examples/telecom-agent -type f ! -path '*/build/*' ! -path '*.egg-info/*' ! -name '*.pyc' -print0 | sort -z \
  | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "==> installing the example agent examples/telecom-agent into .venv (its own distribution, telecom-agent)"
  saying "installing the example agent with pip" \
    .venv/bin/python -m pip install --disable-pip-version-check -q --no-deps --force-reinstall ./examples/telecom-agent
  rm -rf examples/telecom-agent/build examples/telecom-agent/*.egg-info
  echo "$want" > "$stamp"
fi

echo "==> Apache Kafka jars"
saying "fetching the Kafka jars (once, with mvn)" .venv/bin/python -m roundtrip._broker.embedded fetch
