#!/usr/bin/env bash
# Build regent-porcupine, the linearizability checker the chaos checker runs on the workload's
# register history (chaos/porcupine: a small Go program over github.com/anishathalye/porcupine,
# the release pinned in chaos/porcupine/go.mod and go.sum).
#
# Idempotent: if $REPO/.tools/bin/regent-porcupine is already built from the current sources,
# it only prints where it is. Otherwise it builds it with the local Go toolchain, fetching
# porcupine from the Go module proxy, with GOPATH and GOCACHE under $REPO/.tools (git-ignored)
# so nothing outside the repository is touched.
#
# Usage: scripts/install_porcupine.sh [--force]
# Env:   GO (path to the go binary).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$REPO/chaos/porcupine"
TOOLS="$REPO/.tools"
BIN_DIR="$TOOLS/bin"
TARGET="$BIN_DIR/regent-porcupine"
STAMP="$TARGET.sources"  # a digest of the sources the binary was built from
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

for f in main.go go.mod go.sum; do
    if [[ ! -f "$SRC/$f" ]]; then
        echo "error: $SRC/$f is missing; the checker's sources belong in the checkout." >&2
        exit 1
    fi
done
sources="$(cat "$SRC/main.go" "$SRC/go.mod" "$SRC/go.sum" | sha256sum | cut -d' ' -f1)"
version="$(awk '$1 == "require" && $2 == "github.com/anishathalye/porcupine" {print $3}' "$SRC/go.mod")"

if [[ $FORCE -eq 0 && -x "$TARGET" && "$(cat "$STAMP" 2>/dev/null || true)" == "$sources" ]]; then
    echo "regent-porcupine: $TARGET (porcupine $version)"
    exit 0
fi

# shellcheck source=lib/go_env.sh
source "$REPO/scripts/lib/go_env.sh"
use_local_go regent-porcupine "$TOOLS"
export GOFLAGS="-modcacherw -mod=readonly"  # go.mod and go.sum are the pin: never rewrite them
mkdir -p "$BIN_DIR"

echo "building regent-porcupine (porcupine $version) with $("$GO" version) ..."
start=$(date +%s)
if ! (cd "$SRC" && "$GO" build -trimpath -ldflags "-s -w" -o "$TARGET.tmp" .); then
    rm -f "$TARGET.tmp"
    echo "error: building regent-porcupine from $SRC failed (see the go output above)." >&2
    echo "       Check that the Go module proxy is reachable (GOPROXY=$("$GO" env GOPROXY))" >&2
    echo "       and that $("$GO" version) is at least the go version in $SRC/go.mod." >&2
    exit 1
fi
mv -f "$TARGET.tmp" "$TARGET"
echo "$sources" > "$STAMP"
echo "built in $(( $(date +%s) - start ))s"
echo "regent-porcupine: $TARGET (porcupine $version)"
