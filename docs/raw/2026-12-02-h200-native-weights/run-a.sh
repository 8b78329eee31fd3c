#!/usr/bin/env bash
# Native (GGUF-block) weights on the H200, first call: llama.cpp CUDA built in the background
# (llama-bench, llama-batched-bench, llama-quantize; into out/peer/build, kept by later calls that
# do not carry out/peer) while cuda_test runs the packed-weight tests beside the ones they touch,
# then squeezekv bench on the 8B shape in Q4_K_M, Q8_0 and BF16 (native and bf16 device weights).
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
here=docs/raw/2026-12-02-h200-native-weights
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > $OUT/llama_build.txt 2>&1 &&
  timeout 500 cmake --build out/peer/build -j 12 --target llama-bench llama-batched-bench llama-quantize >> $OUT/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt ) &
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared timeout 240 out/dev/cuda_test \
  --gtest_filter='*Packed*:*NativeWeight*:*Bf16Mode*:*ExactMode*:*FusedProducts*:*DecodeBatchIsBatchInvariant*:*DecodeBatchWithin*' 2>&1 | tee $OUT/cuda_test.txt | grep -E "OK|FAILED|Failure|err|packed|native|Expected|Which|actual" | head -60
cfg=bench/configs/llama-3.1-8b.json
for round in 1 2; do
  for t in Q4_K_M Q8_0; do
    echo "== round $round $t native"; timeout 120 out/dev/squeezekv bench --device cuda --dummy $cfg --dummy-type $t -p 512 -n 128 -r 3 2>&1 | grep -E "^\||model:|device:|error" | tee -a $OUT/bench.txt
  done
  echo "== round $round Q4_K_M --device-weights bf16"; timeout 120 out/dev/squeezekv bench --device cuda --dummy $cfg --dummy-type Q4_K_M --device-weights bf16 -p 512 -n 128 -r 3 2>&1 | grep -E "^\||error" | tee -a $OUT/bench.txt
done
wait; cat $OUT/llama_build_rc.txt; tail -3 $OUT/llama_build.txt
