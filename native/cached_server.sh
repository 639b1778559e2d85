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
    # The build's own output goes to stderr: stdout is the path alone.
    EFIM_NATIVE_BUILD="$DIR/build" bash "$NATIVE_DIR/build_server.sh" >&2
    cp "$DIR/build/server/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
    rm -rf "$DIR/build"
fi
echo "$BIN"
