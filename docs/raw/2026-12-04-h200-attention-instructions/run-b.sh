#!/usr/bin/env bash
# The tensor-core decode kernel merging its own splits (its last block a kv head, out/dev) against
# the build before these changes (out/a, commit 6943cbb) and the same build with the merge kernel
# (SQUEEZEKV_CUDA_MERGE_IN_KERNEL=0), beside llama.cpp CUDA built here from the llama-cpp-python
# 0.3.36 sdist while squeezekv runs (its BF16 GGUF of the same shape by bench/make_dummy_gguf.py).
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
lib() { echo "$PWD/out/$1/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64"; }
PEERLIB=$PWD/out/peer/build/bin:/usr/local/cuda/lib64
C=bench/configs/llama-3.1-8b.json
g=/tmp/gguf; mkdir -p $g out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > /tmp/llama_build.txt 2>&1 &&
  timeout 380 cmake --build out/peer/build -j 13 --target llama-batched-bench >> /tmp/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt ) &
( t0=$(date +%s); PYTHONPATH=out/peer/gguf-py timeout 250 python3 bench/make_dummy_gguf.py $C $g/bf16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $? in $(( $(date +%s) - t0 )) s" >> $OUT/gguf.txt ) &
LD_LIBRARY_PATH=$(lib dev) timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure|decode attention:" $OUT/cuda_test.txt | head -10
sb() { LD_LIBRARY_PATH=$(lib $1) timeout 120 out/dev/squeezekv bench --dummy $C --device cuda -p 0 -r 3 "${@:2}" 2>&1 | grep -E "^\| (tg|pp)|rror" >> $OUT/bench_b.txt; }
for round in 1 2; do
  for v in a dev; do
    echo "== $v round $round" >> $OUT/bench_b.txt
    sb $v -b 64 -d 4096 -n 32
    sb $v -b 64 -d 4096 -n 32 --kv-policy squeeze --kv-budget 1024
    sb $v -b 128 -d 32768 -n 32 --kv-policy squeeze --kv-budget 2048
    sb $v -b 64,128 -d 512 -n 64
    sb $v -d 32768 -n 64
  done
  echo "== dev, SQUEEZEKV_CUDA_MERGE_IN_KERNEL=0, round $round" >> $OUT/bench_b.txt
  SQUEEZEKV_CUDA_MERGE_IN_KERNEL=0 sb dev -b 64 -d 4096 -n 32
  SQUEEZEKV_CUDA_MERGE_IN_KERNEL=0 sb dev -b 128 -d 32768 -n 32 --kv-policy squeeze --kv-budget 2048
done
cat $OUT/bench_b.txt
wait; cat $OUT/llama_build_rc.txt; tail -1 $OUT/gguf.txt; tail -3 /tmp/llama_build.txt > $OUT/llama_build_tail.txt
for x in "4096 32 64" "512 64 64" "512 64 128"; do
  set -- $x
  echo "== llama.cpp -pps -npp $1 -ntg $2 -npl $3" | tee -a $OUT/llama_batched_b.txt
  LD_LIBRARY_PATH=$PEERLIB timeout 100 out/peer/build/bin/llama-batched-bench -m $g/bf16.gguf -ngl 99 -fa on -pps -c $(($3 * ($1 + $2))) \
    -npp $1 -ntg $2 -npl $3 2>&1 | grep -E "^\|  *[0-9]|error|failed" | tee -a $OUT/llama_batched_b.txt
done
