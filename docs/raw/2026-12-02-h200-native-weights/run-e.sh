#!/usr/bin/env bash
# Native weights, fifth call (the build of commit beside this file): llama.cpp CUDA built in the
# background while its 8B-shape BF16 GGUF is written, the whole cuda_test runs and the 70B shape
# in Q4_K_M loads and decodes (depth 0 and 8192, and squeeze 2048 at 32768); then llama-quantize
# writes Q4_K_M and Q8_0 and the engines alternate: llama-bench -p 512 -n 128 -r 3 beside
# squeezekv bench --dummy-type of the same preset.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
cfg=bench/configs/llama-3.1-8b.json
g=/tmp/gguf; mkdir -p $g
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > /tmp/llama_build.txt 2>&1 &&
  timeout 400 cmake --build out/peer/build -j 12 --target llama-bench llama-quantize >> /tmp/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt ) &
( PYTHONPATH=out/peer/gguf-py timeout 200 python3 bench/make_dummy_gguf.py $cfg $g/bf16.gguf > $OUT/gguf.txt 2>&1 ) &
SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared timeout 200 out/dev/cuda_test 2>&1 | tee $OUT/cuda_test.txt | grep -E "OK \]|FAILED|Failure|PASSED" | tail -30
echo "== 70B Q4_K_M"
timeout 150 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-70b.json --dummy-type Q4_K_M -p 512 -n 64 -d 0,8192 -r 2 2>&1 | grep -E "^\| [pt]|model:|device:|error|weights" | tee $OUT/bench_70b.txt
timeout 150 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-70b.json --dummy-type Q4_K_M --kv-policy squeeze --kv-budget 2048 -p 0 -n 64 -d 32768 -r 1 2>&1 | grep -E "^\| [pt]|kv:|error" | tee -a $OUT/bench_70b.txt
nvidia-smi --query-gpu=memory.used --format=csv,noheader
wait; cat $OUT/llama_build_rc.txt $OUT/gguf.txt | tail -3
Q=out/peer/build/bin
ours() { echo "== squeezekv $1"; timeout 90 out/dev/squeezekv bench --device cuda --dummy $cfg --dummy-type $1 -p 512 -n 128 -r 3 2>&1 | grep -E "^\| [pt]|model:|error" | tee -a $OUT/squeezekv_bench.txt; }
theirs() { echo "== llama.cpp $1"; timeout 90 $Q/llama-bench -m $g/$1.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>&1 | grep -E "^\| " | tee -a $OUT/llama_bench.txt; }
for t in Q4_K_M Q8_0; do
  t0=$(date +%s); timeout 120 $Q/llama-quantize $g/bf16.gguf $g/$t.gguf $t 16 > $OUT/quantize_$t.txt 2>&1
  echo "llama-quantize $t rc $? in $(( $(date +%s) - t0 )) s"; grep -E "quant size" $OUT/quantize_$t.txt
  theirs $t; ours $t; theirs $t; ours $t
done
