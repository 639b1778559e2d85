#!/usr/bin/env bash
# Build llama-server (CPU) from the same llama.cpp source the Python package runs: the peer that
# `efim bench` compares against. A benchmark dependency, never a runtime one.
#
#   native/build_server.sh            # or: make server
#   native/build/server/bin/llama-server --version
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

OUT="$BUILD_ROOT/server"
mkdir -p "$OUT"
exec > >(tee "$OUT/build.log") 2>&1
SRC="$(llama_source)"
log "llama.cpp source: $SRC (llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist)"
cmake -S "$SRC" -B "$OUT" "${COMMON_CMAKE_FLAGS[@]}" \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_APP=OFF \
    ${EXTRA_CMAKE_ARGS:-}
START=$(date +%s)
cmake --build "$OUT" --target llama-server -j "$JOBS"
log "built in $(( $(date +%s) - START )) s: $OUT/bin/llama-server"
"$OUT/bin/llama-server" --version
