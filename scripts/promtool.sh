#!/usr/bin/env bash
# promtool without Docker: builds Prometheus's own rule checker from its Go module, once, into the cache; the alert
# rules' tests (deploy/prometheus/tests, tests/integration/test_alert_rules.py) run `promtool check rules` and
# `promtool test rules` with it.
#
#   bash scripts/promtool.sh build     # build once into the cache if missing (cold: ~3.5 CPU-minutes), print its path
#   bash scripts/promtool.sh path      # print the path of the cached binary (exit 1 if not built)
#   bash scripts/promtool.sh check-go  # exit 0 if the Go here can build it, else say why on stdout and exit 1
#   bash scripts/promtool.sh test      # build if missing, then check and unit-test the rules in deploy/prometheus
#
# Prometheus 3 is released as Go module github.com/prometheus/prometheus v0.3xx (v0.316.0 = Prometheus 3.16). Its
# go.mod has no replace directives, so `go install .../cmd/promtool@<version>` builds it as released.
#
# Settings (environment):
#   ROUNDTRIP_PROMTOOL_VERSION  module version (default v0.316.0)
#   ROUNDTRIP_PROMTOOL_CACHE    folder of the cached binary (default ~/.cache/roundtrip/promtool-<version>)
# Needs: Go (>= the module's go directive; Debian: golang-go, or go.dev/dl) and the Go module proxy.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=${ROUNDTRIP_PROMTOOL_VERSION:-v0.316.0}
CACHE=${ROUNDTRIP_PROMTOOL_CACHE:-$HOME/.cache/roundtrip/promtool-$VERSION}
BIN=$CACHE/promtool
MODULE=github.com/prometheus/prometheus
GO_NEEDED=${ROUNDTRIP_PROMTOOL_GO:-1.26.7}   # the go directive of the module's go.mod (v0.316.0)

TOOL=promtool
WHAT="the Prometheus module $MODULE/cmd/promtool@$VERSION"
# shellcheck source=scripts/gobuild.sh
source scripts/gobuild.sh

compile() {
  # work is not local: the EXIT trap removes it after compile returned
  work=$(mktemp -d "${TMPDIR:-/tmp}/roundtrip-promtool-build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  # the local toolchain only (GOTOOLCHAIN=local): check_go vouched for it, and a build must not fetch another.
  # remove_all_sd (Prometheus's own build tag) leaves out the cloud service discoveries the rule commands never use:
  # about half the packages to compile
  GOBIN=$work CGO_ENABLED=0 GOTOOLCHAIN=local go install -trimpath -tags remove_all_sd "$MODULE/cmd/promtool@$VERSION"
  mv "$work/promtool" "$1"
}

case "${1:-}" in
  build) build ;;
  check-go) check_go ;;
  path) cached_path ;;
  test)
    bin=$(build)
    "$bin" check rules deploy/prometheus/roundtrip-rules.yaml
    "$bin" test rules deploy/prometheus/tests/*.yaml
    ;;
  *) echo "usage: $0 build|path|check-go|test" >&2; exit 2 ;;
esac
