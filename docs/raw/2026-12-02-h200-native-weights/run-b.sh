#!/usr/bin/env bash
# Native weights, second call: the rows rearranged into planes (whole 16-byte loads a group).
# llama.cpp CUDA built again in the background while its 8B-shape BF16 GGUF is written
# (bench/make_dummy_gguf.py) and cuda_test and squeezekv bench run; then llama-quantize writes
# Q4_K_M and Q8_0 from that GGUF and the two engines alternate, llama-bench -p 512 -n 128 -r 3
# beside squeezekv bench --dummy-type of the same preset.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
cfg=bench/configs/llama-3.1-8b.json
g=/tmp/gguf; mkdir -p $g
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > $OUT/llama_build.txt 2>&1 &&
  timeout 420 cmake --build out/peer/build -j 12 --target llama-bench llama-quantize >> $OUT/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt ) &
( t0=$(date +%s); PYTHONPATH=out/peer/gguf-py timeout 300 python3 bench/make_dummy_gguf.py $cfg $g/bf16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $? in $(( $(date +%s) - t0 )) s" >> $OUT/gguf.txt ) &
SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared timeout 120 out/dev/cuda_test \
  --gtest_filter='*Packed*:*NativeWeight*:*Bf16Mode*:*DecodeBatchIsBatchInvariant*' 2>&1 | tee $OUT/cuda_test.txt | grep -E "OK \]|FAILED|Failure|packed|native|Expected|Which|actual|dummy" | head -40
ours() {  # preset [extra flags]
  local t=$1; shift
  echo "== squeezekv $t $*"; timeout 100 out/dev/squeezekv bench --device cuda --dummy $cfg --dummy-type $t -p 512 -n 128 -r 3 "$@" 2>&1 | grep -E "^\| [pt]|model:|error" | tee -a $OUT/squeezekv_bench.txt
}
ours Q4_K_M; ours Q8_0; ours Q6_K; ours Q4_0
wait; cat $OUT/llama_build_rc.txt $OUT/gguf.txt | tail -3; ls -la $g
Q=out/peer/build/bin
theirs() {
  echo "== llama.cpp $1"; timeout 100 $Q/llama-bench -m $g/$1.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>&1 | grep -E "^\| " | tee -a $OUT/llama_bench.txt
}
for t in Q4_K_M Q8_0; do
  t0=$(date +%s); timeout 150 $Q/llama-quantize $g/bf16.gguf $g/$t.gguf $t 16 > $OUT/quantize_$t.txt 2>&1
  echo "llama-quantize $t rc $? in $(( $(date +%s) - t0 )) s"; grep -E "model size|quant size" $OUT/quantize_$t.txt
  theirs $t; ours $t; theirs $t; ours $t
done
