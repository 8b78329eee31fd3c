#!/usr/bin/env bash
# Decode batches over packed weights on the tensor cores (gemm_rows_q.cu), first call: llama.cpp
# CUDA (llama-batched-bench, llama-quantize) built in the background while its 8B-shape BF16 GGUF
# is written and the whole cuda_test runs; then squeezekv's 8B shape in Q4_K_M at context 512
# for B = 1..128 (gemm_rows_q with 64 and 128 weight rows a block, the dequantization to bf16 and
# cuBLAS it replaces, the GEMV at 8 and 16 rows, bf16 weights), Q8_0 at 64, and llama.cpp's
# Q4_K_M (its own llama-quantize) at the same B and context; the engines alternate.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
DEVLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64 PEERLIB=$PWD/out/peer/build/bin:/usr/local/cuda/lib64
cfg=bench/configs/llama-3.1-8b.json
g=/tmp/gguf; mkdir -p $g
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > /tmp/llama_build.txt 2>&1 &&
  timeout 380 cmake --build out/peer/build -j 12 --target llama-batched-bench llama-quantize >> /tmp/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt
  PYTHONPATH=out/peer/gguf-py timeout 100 python3 bench/make_dummy_gguf.py $cfg $g/bf16.gguf > $OUT/gguf.txt 2>&1
  t0=$(date +%s); LD_LIBRARY_PATH=$PEERLIB timeout 120 out/peer/build/bin/llama-quantize $g/bf16.gguf $g/Q4_K_M.gguf Q4_K_M 16 > $OUT/quantize.txt 2>&1
  echo "llama-quantize rc $? in $(( $(date +%s) - t0 )) s" >> $OUT/llama_build_rc.txt; rm -f $g/bf16.gguf ) &
echo "== cuda_test"; LD_LIBRARY_PATH=$DEVLIB timeout 170 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|Expected|Which is|packed weights|native:" $OUT/cuda_test.txt | head -30
sb() { echo "== squeezekv $*"; LD_LIBRARY_PATH=$DEVLIB timeout 120 out/dev/squeezekv bench --device cuda --dummy $cfg -p 0 -n 32 -d 512 -r 3 "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/squeezekv_bench.txt; }
lb() { echo "== llama.cpp $*"; LD_LIBRARY_PATH=$PEERLIB timeout 150 out/peer/build/bin/llama-batched-bench -m $g/Q4_K_M.gguf -ngl 99 -fa on -pps "$@" 2>&1 | grep -E "^\|  *[0-9]|error|failed" | tee -a $OUT/llama_batched.txt; }
sb --dummy-type Q4_K_M -b 1,8,16,32,64,128
SQUEEZEKV_CUDA_QOUT=128 sb --dummy-type Q4_K_M -b 32,64,128
SQUEEZEKV_CUDA_QGEMV_ROWS=4 sb --dummy-type Q4_K_M -b 8,16
SQUEEZEKV_CUDA_QMMA=0 sb --dummy-type Q4_K_M -b 64
sb --dummy-type Q8_0 -b 64
SQUEEZEKV_CUDA_QOUT=128 sb --dummy-type Q8_0 -b 64
sb --dummy-type BF16 -b 64
wait; cat $OUT/llama_build_rc.txt; grep -E "quant size|error" $OUT/quantize.txt | head -3
lb -c 70000 -npp 512 -ntg 32 -npl 1,8,16,32,64,128
sb --dummy-type Q4_K_M -b 64,128
SQUEEZEKV_CUDA_QOUT=128 sb --dummy-type Q4_K_M -b 64,128
lb -c 70000 -npp 512 -ntg 32 -npl 64,128
