# Shared by the native/ build scripts: where the pinned llama.cpp source comes from.
# The source is the llama.cpp tree vendored in the pinned llama-cpp-python sdist, so the CUDA
# backend and the llama-server peer are the very llama.cpp the Python package runs.
set -euo pipefail

NATIVE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT_DIR="$(dirname "$NATIVE_DIR")"
CACHE_DIR="${EFIM_NATIVE_CACHE:-$NATIVE_DIR/.cache}"
BUILD_ROOT="${EFIM_NATIVE_BUILD:-$NATIVE_DIR/build}"
PY="${PY:-$ROOT_DIR/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
# The version pyproject.toml pins, so the two can never drift apart.
LLAMA_CPP_PYTHON_VERSION="$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' "$ROOT_DIR/pyproject.toml" | head -1)"
JOBS="${JOBS:-$(nproc)}"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# Prints the path of the vendored llama.cpp tree, downloading the sdist from PyPI once.
llama_source() {
    local dir="$CACHE_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
    if [ ! -f "$dir/vendor/llama.cpp/CMakeLists.txt" ]; then
        mkdir -p "$CACHE_DIR"
        "$PY" -m pip download -q --no-deps --no-binary :all: \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$CACHE_DIR" >&2
        tar -xzf "$CACHE_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$CACHE_DIR"
    fi
    echo "$dir/vendor/llama.cpp"
}

# CMake flags shared by every build here: no network at configure time, no extras.
COMMON_CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
)
