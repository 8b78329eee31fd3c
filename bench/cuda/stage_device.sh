#!/usr/bin/env bash
# Stages what a GPU machine without network or apt needs into out/ (ignored by git; the device
# tool carries it as `carry: ["out"]`, 64 MiB at most):
#   out/dev      this build's programs (squeezekv, cuda_test, ops_test, squeezekv_bench_ops), out/dev/lib its
#                shared libraries, out/dev/shared the tiny test models and one Austen novel
#   out/sys/lib  the Debian libraries those programs link that a CUDA image lacks (resolved by ldd)
#   out/peer     llama.cpp's source from the llama-cpp-python sdist (PyPI) and its gguf-py, built
#                and run there as a peer, never part of this project (--peer)
# Usage: bench/cuda/stage_device.sh [--build DIR] [--as NAME] [--peer]
#   --as NAME    stage only the libraries, into out/NAME/lib (a second build to compare beside
#                out/dev: LD_LIBRARY_PATH picks one)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
build=build name=dev peer=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --as) name="$2"; shift 2 ;;
    --peer) peer=1; shift ;;
    *) echo "stage_device.sh: unknown argument '$1' (expected --build DIR, --as NAME, --peer)" >&2; exit 2 ;;
  esac
done
shared="${SQUEEZEKV_SHARED:-$root/../shared}"
for f in "$build/squeezekv" "$build/libsqueezekv.so.0" "$build/libsqueezekv_cuda.so"; do
  [ -e "$f" ] || { echo "stage_device.sh: $f is missing (a CUDA build: cmake -S . -B $build -DSQUEEZEKV_CUDA=ON)" >&2; exit 1; }
done
mkdir -p "out/$name/lib"
cp -L "$build/libsqueezekv.so.0" "$build/libsqueezekv_cuda.so" "out/$name/lib/"
if [ "$name" = dev ]; then
  cp "$build/squeezekv" out/dev/
  for f in "$build/tests/cuda_test" "$build/tests/ops_test" "$build/squeezekv_bench_ops"; do [ -e "$f" ] && cp "$f" out/dev/; done
  mkdir -p out/dev/shared/models out/dev/shared/data/austen
  cp -r "$shared/models/stories260k" "$shared/models/tinystories-656k" out/dev/shared/models/
  cp "$shared/data/austen/emma.txt" out/dev/shared/data/austen/
  # the Debian libraries the programs link beyond glibc, the C++ runtime and CUDA's own
  mkdir -p out/sys/lib
  progs=(out/dev/squeezekv out/dev/lib/libsqueezekv.so.0)
  [ -e out/dev/cuda_test ] && progs+=(out/dev/cuda_test)
  ldd "${progs[@]}" | awk '/=> \//{print $3}' | sort -u |
    grep -E 'lib(pcre2|cpp-httplib|brotli|gomp|gtest|gmock|ssl|crypto|z|zstd)[.-]' |
    while read -r so; do cp -L "$so" out/sys/lib/; done
fi
if [ "$peer" = 1 ] && [ ! -e out/peer/llama-src.tar.xz ]; then
  tmp=$(mktemp -d)
  python3 -m pip download --no-deps --no-binary :all: --dest "$tmp" llama-cpp-python==0.3.36 > /dev/null
  tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
  src="$tmp/llama_cpp_python-0.3.36/vendor/llama.cpp"
  mkdir -p out/peer
  tar cJf out/peer/llama-src.tar.xz -C "$(dirname "$src")" --exclude=.git --exclude=llama.cpp/models --exclude=llama.cpp/docs \
    --exclude=llama.cpp/media --exclude=llama.cpp/tools/server/public llama.cpp  # 8.4 MB: vocabularies, docs, web UI left out
  cp -r "$src/gguf-py" out/peer/gguf-py
  rm -rf "$tmp"
fi
du -sh out 2>/dev/null | awk '{print "out/: " $1 " (the device tool carries 64 MiB at most)"}'
