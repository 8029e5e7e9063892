#!/usr/bin/env bash
# Jaeger v2 without Docker: builds the real Jaeger v2 binary from its Go module and runs it with
# in-memory storage (deploy/jaeger/config.yaml).
#
#   bash scripts/jaeger.sh build   # build once into the cache if missing (~6-7 min on 2 cores), print its path
#   bash scripts/jaeger.sh path    # print the path of the cached binary (exit 1 if not built)
#   bash scripts/jaeger.sh check-go  # exit 0 if the Go here can build it, else say why on stdout and exit 1
#   bash scripts/jaeger.sh run     # build if missing, then run it in the foreground
#
# Jaeger v2 is released as Go module github.com/jaegertracing/jaeger v1.x (v1.76.0 = Jaeger 2.13.0,
# the docker image jaegertracing/jaeger:2.13.0). `go install .../cmd/jaeger@v1.76.0` refuses because
# the module's go.mod has replace directives, so it is built as the main module: download the
# module source from the Go module proxy, copy it somewhere writable, `go build ./cmd/jaeger` there.
# No UI assets are embedded (the UI page is a placeholder); the query API on :16686 works.
#
# Settings (environment):
#   ROUNDTRIP_JAEGER_VERSION  module version (default v1.76.0)
#   ROUNDTRIP_JAEGER_CACHE    folder of the cached binary (default ~/.cache/roundtrip/jaeger-<version>)
#   JAEGER_HOST               address `run` listens on (127.0.0.1; 0.0.0.0 for other machines)
#   JAEGER_OTLP_GRPC_PORT / JAEGER_OTLP_HTTP_PORT / JAEGER_QUERY_PORT / JAEGER_QUERY_GRPC_PORT /
#   JAEGER_HEALTH_PORT        its ports (4317 / 4318 / 16686 / 16685 / 13133), read by deploy/jaeger/config.yaml
# Needs: Go (>= the module's go directive; Debian: golang-go, or go.dev/dl) and the Go module proxy.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=${ROUNDTRIP_JAEGER_VERSION:-v1.76.0}
CACHE=${ROUNDTRIP_JAEGER_CACHE:-$HOME/.cache/roundtrip/jaeger-$VERSION}
BIN=$CACHE/jaeger
MODULE=github.com/jaegertracing/jaeger
GO_NEEDED=${ROUNDTRIP_JAEGER_GO:-1.24.6}   # the go directive of the module's go.mod (v1.76.0)

TOOL=jaeger
WHAT="the Jaeger module $MODULE@$VERSION"
# shellcheck source=scripts/gobuild.sh
source scripts/gobuild.sh

compile() {
  local src release
  # not local: the EXIT trap removes it after compile returned
  src=$(go mod download -json "$MODULE@$VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  work=$(mktemp -d "${TMPDIR:-/tmp}/roundtrip-jaeger-build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  cp -r "$src/." "$work/"
  chmod -R u+w "$work"          # the module cache is read-only
  # `jaeger version` reports the v2 release the module version belongs to (CHANGELOG: "v1.76.0 / v2.13.0")
  release=$(sed -n "s|^$VERSION / \(v2\.[0-9.]*\).*|\1|p" "$work/CHANGELOG.md" | head -1)
  (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
     -ldflags "-X $MODULE/internal/version.latestVersion=${release:-$VERSION}" -o "$1" ./cmd/jaeger)
}

case "${1:-}" in
  build) build ;;
  check-go) check_go ;;
  path) cached_path ;;
  run)
    build >/dev/null
    h=${JAEGER_HOST:-127.0.0.1}
    echo "==> Jaeger v2 (in memory): OTLP http://$h:${JAEGER_OTLP_HTTP_PORT:-4318} (ROUNDTRIP_OTLP_ENDPOINT) and $h:${JAEGER_OTLP_GRPC_PORT:-4317} (gRPC), query API and UI http://$h:${JAEGER_QUERY_PORT:-16686}" >&2
    exec "$BIN" --config "file:$PWD/deploy/jaeger/config.yaml"
    ;;
  *) echo "usage: $0 build|path|run|check-go" >&2; exit 2 ;;
esac
