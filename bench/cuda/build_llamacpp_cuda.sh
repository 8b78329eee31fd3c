#!/usr/bin/env bash
# Builds llama.cpp CUDA's llama-bench and llama-batched-bench on this project's machine (no GPU
# needed: nvcc 13 and cuBLAS are installed) from the llama-cpp-python 0.3.36 sdist (PyPI), for
# sm_90, and packs them as out/peer/llama.tar.xz (~41 MB: llama/bin/llama-bench and
# llama-batched-bench, llama/lib/*.so.0), so that a device call whose own compile time it cannot
# spare (bench/cuda/compare_70b.sh) carries them beside squeezekv's build. 18 minutes on this
# project's 2-core machine (2026-12-06). There is no libcuda here, so the executables are linked
# with --allow-shlib-undefined; the device's driver supplies it. A measuring instrument: nothing
# of it enters this repository.
#   bench/cuda/build_llamacpp_cuda.sh [WORKDIR]      (default /tmp/llama-cuda)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
w="${1:-/tmp/llama-cuda}"
mkdir -p "$w"
if [ ! -d "$w/llama_cpp_python-0.3.36/vendor/llama.cpp" ]; then
  python3 -m pip download --no-deps --no-binary :all: --dest "$w" llama-cpp-python==0.3.36 > /dev/null
  tar xzf "$w/llama_cpp_python-0.3.36.tar.gz" -C "$w"
fi
src="$w/llama_cpp_python-0.3.36/vendor/llama.cpp"
cmake -S "$src" -B "$w/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined > /dev/null
cmake --build "$w/build" --target llama-bench llama-batched-bench
rm -rf "$w/pkg" && mkdir -p "$w/pkg/llama/bin" "$w/pkg/llama/lib"
cp "$w/build/bin/llama-bench" "$w/build/bin/llama-batched-bench" "$w/pkg/llama/bin/"
# the libraries by the names the benches ask for (sonames; each bench's own library has none)
for so in "$w"/build/bin/*.so.0 "$w"/build/bin/*-impl.so; do [ -e "$so" ] && cp -L "$so" "$w/pkg/llama/lib/"; done
strip --strip-unneeded "$w"/pkg/llama/bin/* "$w"/pkg/llama/lib/*  # ~9 MB less to carry
mkdir -p "$root/out/peer"
tar cJf "$root/out/peer/llama.tar.xz" -C "$w/pkg" llama
du -h "$root/out/peer/llama.tar.xz"
