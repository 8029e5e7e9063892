#!/usr/bin/env bash
# Run one test file N times in a row while the unit/integration/chaos half of the suite runs beside it, as CI runs
# the e2e half: how a test that fails now and then beside the other half is shown to hold.
#
# Usage: scripts/repeat-beside-half.sh N TEST_FILE      e.g. scripts/repeat-beside-half.sh 20 tests/e2e/test_up_ready.py
# Exit code: 0 when all N runs passed (the half's own result is printed, not counted).
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:?N}; test=${2:?TEST_FILE}
work=$(mktemp -d "${TMPDIR:-/tmp}/beside.XXXXXX")
.venv/bin/python -m pytest -q -p no:cacheprovider --basetemp "$work/half" tests/unit tests/integration tests/chaos \
  >"$work/half.log" 2>&1 &
half=$!
sleep 20  # the half's first brokers and databases starting: the load the test is to run beside
failed=0
for i in $(seq 1 "$runs"); do
  if .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp "$work/run$i" "$test" >"$work/run$i.log" 2>&1; then
    echo "run $i: passed ($(tail -1 "$work/run$i.log"))"
  else
    failed=$((failed + 1)); echo "run $i: FAILED, see $work/run$i.log"
  fi
  kill -0 "$half" 2>/dev/null || echo "  (the half had ended by run $i: the later runs ran alone)"
done
echo "$test: $((runs - failed)) of $runs passed beside the half"
wait "$half"; echo "the half: exit $? ($(tail -1 "$work/half.log"))"
[ "$failed" -eq 0 ]
