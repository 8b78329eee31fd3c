#!/usr/bin/env bash
# Joined products (issue 26): q, k, v laid out together in one device buffer and multiplied as one
# product of 6144 rows, gate and up as one of 28672, split after (SQUEEZEKV_CUDA_JOIN=0: one
# product a matrix, as before). cuda_test alone on the GPU first; then llama.cpp's build for
# run-b.sh starts on 12 of the 16 cores (as run-d1.sh of 2026-12-02-h200-kv-pool) while the two
# settings alternate twice on the Llama-3.1-8B shape (bf16 dummy weights), and prompts of 128
# tokens time what a squeeze schedule costs at a prompt's end beside h2o and the full cache.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
DEVLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
echo "== cuda_test"; LD_LIBRARY_PATH=$DEVLIB timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|Expected|Which is|joined" $OUT/cuda_test.txt | head -20
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > $OUT/llama_build.txt 2>&1 &&
  timeout 400 cmake --build out/peer/build -j 12 --target llama-batched-bench llama-bench >> $OUT/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt ) &
E="--dummy bench/configs/llama-3.1-8b.json -r 3"
b() { echo "== $*"; LD_LIBRARY_PATH=$DEVLIB timeout 120 env "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench.txt; }
for round in 1 2; do
  for j in 1 0; do
    S="SQUEEZEKV_CUDA_JOIN=$j out/dev/squeezekv bench --device cuda $E"
    b $S -p 512 -n 64 -d 0 -b 1
    b $S -p 0 -n 32 -d 512 -b 64
    b $S -p 0 -n 16 -d 2048 --ctx 2112 -b 128
    b $S -p 0 -n 32 -d 4096 -b 64 --kv-policy squeeze --kv-budget 1024
  done
done
for p in "--kv-policy full" "--kv-policy h2o --kv-budget 64" "--kv-policy squeeze --kv-budget 64"; do
  b out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -r 5 -p 128 -n 0 $p
done
wait; cat $OUT/llama_build_rc.txt; ls out/peer/build/bin 2>/dev/null | head
PYTHONPATH=$PWD/out/peer/gguf-py timeout 150 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json out/peer/l8b.gguf; ls -la out/peer/l8b.gguf
