#!/usr/bin/env bash
# Q8_0 KV rows on the device (issue 27): cuda_test alone on the GPU first; then llama.cpp's build
# for run-b.sh starts on 12 of the 16 cores while f16 and q8_0 rows alternate on the Llama-3.1-8B
# shape (bf16 dummy weights): one sequence at depth 32768 (the full cache), 64 sequences at 4096,
# and 512 prompt tokens after 8192 (a chunk over held rows).
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
DEVLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
echo "== cuda_test"; LD_LIBRARY_PATH=$DEVLIB timeout 200 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|Expected|Which is|q8_0|head dim|decode attention" $OUT/cuda_test.txt | head -40
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > $OUT/llama_build.txt 2>&1 &&
  timeout 420 cmake --build out/peer/build -j 12 --target llama-bench llama-batched-bench >> $OUT/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt ) &
E="--dummy bench/configs/llama-3.1-8b.json"
b() { echo "== $*"; LD_LIBRARY_PATH=$DEVLIB timeout 150 "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench.txt; }
for round in 1 2; do
  for t in f16 q8_0; do
    b out/dev/squeezekv bench --device cuda $E -p 0 -n 32 -d 32768 --ctx 32800 -r 3 --kv-type $t
    b out/dev/squeezekv bench --device cuda $E -p 0 -n 32 -d 4096 -r 3 -b 64 --kv-type $t
    b out/dev/squeezekv bench --device cuda $E -p 512 -n 0 -d 8192 --ctx 8800 -r 3 --kv-type $t
  done
done
b out/dev/squeezekv bench --device cuda $E -p 0 -n 32 -d 4096 -r 3 -b 64 --kv-type q8_0 --kv-policy squeeze --kv-budget 1024
wait; cat $OUT/llama_build_rc.txt; ls out/peer/build/bin 2>/dev/null | head
