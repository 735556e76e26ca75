# Sourced by the scripts that build Go tools from the Go module proxy (Toxiproxy, regent-porcupine):
#
#   use_local_go WHAT TOOLS_DIR
#
# Sets GO to the toolchain ($GO, else go on PATH, else /usr/local/go/bin/go) or exits 1 naming
# WHAT, and keeps GOPATH, GOMODCACHE and GOCACHE under TOOLS_DIR (git-ignored), builds static
# (CGO_ENABLED=0), and never lets the toolchain download another Go (GOTOOLCHAIN=local).

use_local_go() {
    local what="$1" tools="$2"
    GO="${GO:-}"
    if [[ -z "$GO" ]]; then
        if command -v go >/dev/null 2>&1; then
            GO="$(command -v go)"
        elif [[ -x /usr/local/go/bin/go ]]; then
            GO=/usr/local/go/bin/go
        else
            echo "error: $what is not built and no Go toolchain was found." >&2
            echo "       Install Go (https://go.dev/dl/) or set GO=/path/to/go, then rerun $0." >&2
            exit 1
        fi
    fi
    local resolved
    if ! resolved="$(command -v "$GO" 2>/dev/null)" || [[ ! -x "$resolved" ]]; then
        echo "error: the Go toolchain $GO is not an executable; set GO=/path/to/go and rerun $0." >&2
        exit 1
    fi
    GO="$resolved"
    export GOPATH="$tools/gopath"
    export GOMODCACHE="$tools/gopath/pkg/mod"
    export GOCACHE="$tools/gocache"
    export GOFLAGS="-modcacherw"
    export CGO_ENABLED=0
    export GOTOOLCHAIN=local
}
