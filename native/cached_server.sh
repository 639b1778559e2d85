#!/usr/bin/env bash
# Print the path of llama-server built from the pinned llama.cpp, building it once into a cache
# outside the clone, keyed by the llama.cpp version: a fresh clone on a warm machine reuses it.
#
#   native/cached_server.sh        # -> ~/.cache/efim/llama-server/<version>/llama-server
# `make test` runs it (the remote-backend tests start real llama-server processes).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DIR="${EFIM_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/efim/llama-server}/$LLAMA_CPP_PYTHON_VERSION"
BIN="$DIR/llama-server"
if [ ! -x "$BIN" ]; then
    mkdir -p "$DIR"
    # A build directory of its own: two clones building at once (two CI jobs, a worktree's tests)
    # would otherwise share one CMake cache, which refuses a second source tree.
    BUILD="$(mktemp -d "$DIR/build.XXXXXX")"
    trap 'rm -rf "$BUILD"' EXIT
    # The build's own output goes to stderr: stdout is the path alone.
    EFIM_NATIVE_BUILD="$BUILD" bash "$NATIVE_DIR/build_server.sh" >&2
    cp "$BUILD/server/bin/llama-server" "$BIN.$$" && mv "$BIN.$$" "$BIN"
fi
echo "$BIN"
