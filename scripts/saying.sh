# shellcheck shell=bash
# saying WHAT CMD...: runs CMD, and every ROUNDTRIP_SAYING_EVERY seconds (10) it still runs, says it still does WHAT
# (pip -q and mvn are silent for a minute on a fresh machine: a silent wait reads as a hang). CMD's status is its own.
saying() {
  local what=$1 every=${ROUNDTRIP_SAYING_EVERY:-10}
  shift
  "$@" &
  local pid=$! started=$SECONDS
  local next=$((started + every))
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ "$SECONDS" -ge "$next" ] && kill -0 "$pid" 2>/dev/null; then
      echo "    ... still $what ($((SECONDS - started)) s)"
      next=$((next + every))
    fi
  done
  wait "$pid"
}
