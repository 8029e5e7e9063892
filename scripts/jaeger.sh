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

# Go from go.dev/dl lives in /usr/local/go/bin, which a non-login shell (CI) may not have on PATH
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  PATH="$PATH:/usr/local/go/bin"
fi

check_go() {
  command -v go >/dev/null 2>&1 || { echo "no Go toolchain (needs Go >= $GO_NEEDED: go.dev/dl, or Debian's golang-go where it is that recent)"; return 1; }
  local have
  have=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  if [ "$(printf '%s\n%s\n' "$GO_NEEDED" "${have:-0}" | sort -V | head -1)" != "$GO_NEEDED" ]; then
    echo "Go ${have:-?} is older than the $GO_NEEDED the Jaeger module needs"
    return 1
  fi
}

build() {
  if [ -x "$BIN" ]; then
    echo "$BIN"
    return
  fi
  local why
  why=$(check_go) || { echo "jaeger.sh: cannot build: $why" >&2; exit 1; }
  echo "==> building Jaeger v2 ($MODULE@$VERSION) into $BIN; takes several minutes once" >&2
  local started src
  started=$(date +%s)
  src=$(go mod download -json "$MODULE@$VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  work=$(mktemp -d "${TMPDIR:-/tmp}/roundtrip-jaeger-build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  cp -r "$src/." "$work/"
  chmod -R u+w "$work"          # the module cache is read-only
  mkdir -p "$CACHE"
  # `jaeger version` reports the v2 release the module version belongs to (CHANGELOG: "v1.76.0 / v2.13.0")
  local release
  release=$(sed -n "s|^$VERSION / \(v2\.[0-9.]*\).*|\1|p" "$work/CHANGELOG.md" | head -1)
  (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
     -ldflags "-X $MODULE/internal/version.latestVersion=${release:-$VERSION}" -o "$BIN.partial" ./cmd/jaeger)
  mv "$BIN.partial" "$BIN"     # atomic: a half-built binary never looks cached
  echo "==> built $BIN in $(( $(date +%s) - started )) s" >&2
  echo "$BIN"
}

case "${1:-}" in
  build) build ;;
  check-go) check_go ;;
  path) [ -x "$BIN" ] && echo "$BIN" || { echo "jaeger.sh: not built yet; run: bash scripts/jaeger.sh build" >&2; exit 1; } ;;
  run)
    build >/dev/null
    h=${JAEGER_HOST:-127.0.0.1}
    echo "==> Jaeger v2 (in memory): OTLP http://$h:${JAEGER_OTLP_HTTP_PORT:-4318} (ROUNDTRIP_OTLP_ENDPOINT) and $h:${JAEGER_OTLP_GRPC_PORT:-4317} (gRPC), query API and UI http://$h:${JAEGER_QUERY_PORT:-16686}" >&2
    exec "$BIN" --config "file:$PWD/deploy/jaeger/config.yaml"
    ;;
  *) echo "usage: $0 build|path|run|check-go" >&2; exit 2 ;;
esac
