#!/usr/bin/env bash
# Build the pinned llama.cpp with CUDA (GGML_CUDA=on) as shared libraries that llama-cpp-python
# loads through LLAMA_CPP_LIB_PATH.
#
#   CUDA_ARCHS="86-real;89-real" native/build_cuda.sh      # or: make cuda CUDA_ARCHS=...
#   LLAMA_CPP_LIB_PATH=native/build/cuda/bin efim status
#
# cuBLAS comes from PyPI's nvidia-cublas wheel (headers and libraries), so only nvcc is needed
# from a CUDA install. Without a GPU the result compiles and links but cannot run.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

CUDA_ARCHS="${CUDA_ARCHS:-86-real}"
CUBLAS_VERSION="${CUBLAS_VERSION:-13.0.2.14}"   # cuBLAS of CUDA 13.0, the nvcc installed here
# The toolkit root: CUDA_HOME, else the one around the nvcc on PATH, else /usr/local/cuda
# (nvcc on PATH may be a wrapper script outside the toolkit).
if [ -z "${CUDA_HOME:-}" ]; then
    CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /nonexistent)")")")"
    [ -f "$CUDA_HOME/include/cuda_runtime.h" ] || CUDA_HOME=/usr/local/cuda
fi
CUDA_HOME="$(readlink -f "$CUDA_HOME")"
NVCC="$CUDA_HOME/bin/nvcc"
OUT="$BUILD_ROOT/cuda"
mkdir -p "$OUT"
LOG="$OUT/build.log"
exec > >(tee "$LOG") 2>&1

[ -x "$NVCC" ] || { echo "error: nvcc not found (set CUDA_HOME to the CUDA toolkit)"; exit 2; }
log "nvcc: $NVCC ($("$NVCC" --version | tail -1))"
log "CUDA toolkit: $CUDA_HOME"
log "architectures: $CUDA_ARCHS"
log "extra CMake args: ${EXTRA_CMAKE_ARGS:-none}"

# cuBLAS from the registry: unpack the wheel and give the versioned libraries the plain names
# CMake's FindCUDAToolkit looks for.
CUBLAS_DIR="$CACHE_DIR/cublas-$CUBLAS_VERSION"
if [ ! -f "$CUBLAS_DIR/include/cublas_v2.h" ]; then
    rm -rf "$CUBLAS_DIR.tmp" && mkdir -p "$CUBLAS_DIR.tmp"
    "$PY" -m pip download -q --no-deps "nvidia-cublas==$CUBLAS_VERSION" -d "$CUBLAS_DIR.tmp"
    "$PY" -m zipfile -e "$CUBLAS_DIR.tmp"/nvidia_cublas-*.whl "$CUBLAS_DIR.tmp/x"
    mkdir -p "$CUBLAS_DIR"
    cp -r "$CUBLAS_DIR.tmp"/x/nvidia/cu*/include "$CUBLAS_DIR.tmp"/x/nvidia/cu*/lib "$CUBLAS_DIR/"
    cp "$CUBLAS_DIR.tmp"/nvidia_cublas-*.whl "$CUBLAS_DIR/"
    rm -rf "$CUBLAS_DIR.tmp"
    for so in "$CUBLAS_DIR"/lib/lib*.so.*; do ln -sf "$(basename "$so")" "${so%%.so.*}.so"; done
fi
WHEEL="$(ls "$CUBLAS_DIR"/nvidia_cublas-*.whl)"
log "cuBLAS source: PyPI nvidia-cublas==$CUBLAS_VERSION ($(basename "$WHEEL"), sha256 $(sha256sum "$WHEEL" | cut -c1-16)…)"
log "cuBLAS dir: $CUBLAS_DIR"

SRC="$(llama_source)"
log "llama.cpp source: $SRC (llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist)"

# GGML_CUDA_NO_VMM: the driver library (libcuda) is not on a machine without a GPU or driver,
# and VMM is the only part of ggml-cuda that links it directly.
cmake -S "$SRC" -B "$OUT" "${COMMON_CMAKE_FLAGS[@]}" \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF \
    -DGGML_CUDA=ON -DGGML_CUDA_NO_VMM=ON -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" \
    -DCUDAToolkit_ROOT="$CUDA_HOME" \
    -DCUDA_cublas_LIBRARY="$CUBLAS_DIR/lib/libcublas.so" \
    -DCUDA_cublasLt_LIBRARY="$CUBLAS_DIR/lib/libcublasLt.so" \
    -DCMAKE_CUDA_FLAGS="-I$CUBLAS_DIR/include" -DCMAKE_CXX_FLAGS="-I$CUBLAS_DIR/include" \
    ${EXTRA_CMAKE_ARGS:-}
START=$(date +%s)
cmake --build "$OUT" --target llama -j "$JOBS"
log "built in $(( $(date +%s) - START )) s"
ls -l "$OUT/bin"/lib*.so*
# Prove the result is a CUDA backend linked against the registry's cuBLAS.
readelf -d "$OUT/bin/libggml-cuda.so" | grep NEEDED
# Without a GPU, ggml's CUDA init fails and llama.cpp falls back to its CPU backend, so loading
# the libraries through llama-cpp-python still proves they link and resolve.
RUNTIME_LIBS="$CUBLAS_DIR/lib:$CUDA_HOME/lib64"
EFIM="$ROOT_DIR/.venv/bin/efim"
if [ -x "$EFIM" ]; then
    LLAMA_CPP_LIB_PATH="$OUT/bin" LD_LIBRARY_PATH="$RUNTIME_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$EFIM" status --json | "$PY" -c 'import json, sys; s = json.load(sys.stdin); print("loaded by llama-cpp-python:", s["library"], "gpu_offload:", s["gpu_offload"])'
fi
log "OK: CUDA backend in $OUT/bin (architectures $CUDA_ARCHS). It cannot run on a GPU here: there is none."
log "use it with: LLAMA_CPP_LIB_PATH=$OUT/bin LD_LIBRARY_PATH=$RUNTIME_LIBS efim status"
