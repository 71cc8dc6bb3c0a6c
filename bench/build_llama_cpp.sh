#!/usr/bin/env bash
# Builds llama.cpp's tools for the benchmarks (never a dependency of exo): llama-server,
# ggml-rpc-server (the RPC backend the split bench uses) and the shared libraries that
# llama-cpp-python loads through LLAMA_CPP_LIB_PATH, from the llama.cpp sources inside
# llama-cpp-python's sdist, natively for this CPU (-DGGML_NATIVE=ON) with the RPC backend.
#
#   bash bench/build_llama_cpp.sh [OUT_DIR]      (default ~/.cache/exo-bench/llama.cpp)
#
# Then: LLAMA_SERVER=OUT/bin/llama-server LLAMA_RPC_SERVER=OUT/bin/ggml-rpc-server
#       LLAMA_CPP_LIB_PATH=OUT/lib  (for bench/engine.py's llama-cpp-python rows)
# Needs cmake, a C/C++ compiler and pip (PyPI); takes 10-20 minutes on 2 cores.
set -euo pipefail
VERSION=0.3.36
OUT="${1:-$HOME/.cache/exo-bench/llama.cpp}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE="${GGML_NATIVE:-ON}" -DGGML_RPC=ON -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib'
cmake --build "$WORK/build" --target llama-server ggml-rpc-server llama -j "$(nproc)"
mkdir -p "$OUT/bin" "$OUT/lib"
cp "$WORK/build/bin/llama-server" "$WORK/build/bin/ggml-rpc-server" "$OUT/bin/"
cp -P "$WORK"/build/bin/*.so* "$OUT/lib/" 2>/dev/null || true
find "$WORK/build" -name '*.so*' -exec cp -P {} "$OUT/lib/" \;
# The binaries find their libraries in ../lib (their RPATH is $ORIGIN/../lib).
echo "built into $OUT:"
echo "  LLAMA_SERVER=$OUT/bin/llama-server"
echo "  LLAMA_RPC_SERVER=$OUT/bin/ggml-rpc-server"
echo "  LLAMA_CPP_LIB_PATH=$OUT/lib"
