# Sourced by scripts/jaeger.sh and scripts/promtool.sh: a Go binary built once from its module into the cache and
# reused. The sourcing script sets TOOL (its own name), WHAT (the module, in words), BIN and GO_NEEDED, and defines
# `compile <output>` (the build itself); `build` checks the Go here, compiles atomically and prints the binary's path.

# Go from go.dev/dl lives in /usr/local/go/bin, which a non-login shell (CI) may not have on PATH
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  PATH="$PATH:/usr/local/go/bin"
fi

check_go() {
  command -v go >/dev/null 2>&1 || { echo "no Go toolchain (needs Go >= $GO_NEEDED: go.dev/dl, or Debian's golang-go where it is that recent)"; return 1; }
  local have
  have=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  if [ "$(printf '%s\n%s\n' "$GO_NEEDED" "${have:-0}" | sort -V | head -1)" != "$GO_NEEDED" ]; then
    echo "Go ${have:-?} is older than the $GO_NEEDED $WHAT needs"
    return 1
  fi
}

build() {
  if [ -x "$BIN" ]; then
    echo "$BIN"
    return
  fi
  local why started
  why=$(check_go) || { echo "$TOOL.sh: cannot build: $why" >&2; exit 1; }
  echo "==> building $TOOL ($WHAT) into $BIN; takes several minutes once" >&2
  started=$(date +%s)
  mkdir -p "$(dirname "$BIN")"
  compile "$BIN.partial"
  mv "$BIN.partial" "$BIN"     # atomic: a half-built binary never looks cached
  echo "==> built $BIN in $(( $(date +%s) - started )) s" >&2
  echo "$BIN"
}

cached_path() {
  [ -x "$BIN" ] && echo "$BIN" || { echo "$TOOL.sh: not built yet; run: bash scripts/$TOOL.sh build" >&2; exit 1; }
}
