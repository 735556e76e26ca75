#!/usr/bin/env bash
# Install the Toxiproxy server that chaos tests and runs drive.
#
# Idempotent: if toxiproxy-server is already on PATH or in $REPO/.tools/bin, it
# only prints where it is. Otherwise it builds the pinned release with the local
# Go toolchain from the Go module proxy, keeping GOPATH and GOCACHE under
# $REPO/.tools (git-ignored) so nothing outside the repository is touched.
#
# Usage: scripts/install_toxiproxy.sh [--force]
# Env:   TOXIPROXY_VERSION (default below), GO (path to the go binary).
set -euo pipefail

TOXIPROXY_VERSION="${TOXIPROXY_VERSION:-v2.12.0}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$REPO/.tools"
BIN_DIR="$TOOLS/bin"
TARGET="$BIN_DIR/toxiproxy-server"
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

if [[ $FORCE -eq 0 ]]; then
    if [[ -x "$TARGET" ]]; then
        echo "toxiproxy-server: $TARGET ($("$TARGET" -version 2>/dev/null | head -1 || true))"
        exit 0
    fi
    if found="$(command -v toxiproxy-server 2>/dev/null)"; then
        echo "toxiproxy-server: $found ($("$found" -version 2>/dev/null | head -1 || true))"
        exit 0
    fi
fi

# shellcheck source=lib/go_env.sh
source "$REPO/scripts/lib/go_env.sh"
use_local_go toxiproxy-server "$TOOLS"
mkdir -p "$BIN_DIR"

echo "building toxiproxy $TOXIPROXY_VERSION with $("$GO" version) ..."
start=$(date +%s)
if ! GOBIN="$BIN_DIR" "$GO" install \
        -ldflags "-s -w -X github.com/Shopify/toxiproxy/v2.Version=${TOXIPROXY_VERSION#v}" \
        "github.com/Shopify/toxiproxy/v2/cmd/server@${TOXIPROXY_VERSION}"; then
    echo "error: building toxiproxy $TOXIPROXY_VERSION failed (see the go output above)." >&2
    echo "       Check that the Go module proxy is reachable (GOPROXY=$("$GO" env GOPROXY))," >&2
    echo "       or pick another release with TOXIPROXY_VERSION=v2.x.y $0 --force." >&2
    exit 1
fi
if [[ ! -x "$BIN_DIR/server" ]]; then
    echo "error: go install succeeded but $BIN_DIR/server is missing." >&2
    exit 1
fi
mv -f "$BIN_DIR/server" "$TARGET"
echo "built in $(( $(date +%s) - start ))s"
echo "toxiproxy-server: $TARGET ($("$TARGET" -version 2>/dev/null | head -1 || true))"
