#!/usr/bin/env bash
# The decode attention's tile loop with fewer instructions (out/dev; with its splits at least 64
# keys, the default, and 128: SQUEEZEKV_CUDA_DECODE_SPLIT_KEYS) against the build before (out/a,
# commit 6943cbb), rounds alternated, beside llama.cpp CUDA built here meanwhile from the
# llama-cpp-python 0.3.36 sdist (its BF16 GGUF of the same shape by bench/make_dummy_gguf.py).
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
  timeout 440 cmake --build out/peer/build -j 15 --target llama-batched-bench >> /tmp/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt ) &
( t0=$(date +%s); PYTHONPATH=out/peer/gguf-py timeout 250 python3 bench/make_dummy_gguf.py $C $g/bf16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $? in $(( $(date +%s) - t0 )) s" >> $OUT/gguf.txt ) &
SQUEEZEKV_CUDA_DECODE_SPLIT_KEYS=128 LD_LIBRARY_PATH=$(lib dev) timeout 150 out/dev/cuda_test > $OUT/cuda_test_128.txt 2>&1; echo "cuda_test (splits of 128 keys) rc $?"
grep -E "FAILED|PASSED|Failure|decode attention:" $OUT/cuda_test_128.txt | head -10
sb() { LD_LIBRARY_PATH=$(lib $1) timeout 120 out/dev/squeezekv bench --dummy $C --device cuda -p 0 -r 3 "${@:2}" 2>&1 | grep -E "^\| (tg|pp)|rror" >> $OUT/bench_c.txt; }
shapes() {
  sb $1 -b 64 -d 4096 -n 32
  sb $1 -b 64 -d 4096 -n 32 --kv-policy squeeze --kv-budget 1024
  sb $1 -b 128 -d 32768 -n 32 --kv-policy squeeze --kv-budget 2048
  sb $1 -b 64 -d 512 -n 64
  sb $1 -d 4096 -n 64
}
for order in "a dev dev128" "dev128 dev a"; do
  for v in $order; do
    echo "== $v" >> $OUT/bench_c.txt
    if [ $v = dev128 ]; then SQUEEZEKV_CUDA_DECODE_SPLIT_KEYS=128 shapes dev; else shapes $v; fi
  done
done
cat $OUT/bench_c.txt
wait; cat $OUT/llama_build_rc.txt; tail -1 $OUT/gguf.txt; tail -3 /tmp/llama_build.txt > $OUT/llama_build_tail.txt
for x in "4096 32 64" "512 64 64" "4096 64 1"; do
  set -- $x
  echo "== llama.cpp -pps -npp $1 -ntg $2 -npl $3" | tee -a $OUT/llama_batched_c.txt
  LD_LIBRARY_PATH=$PEERLIB timeout 60 out/peer/build/bin/llama-batched-bench -m $g/bf16.gguf -ngl 99 -fa on -pps -c $(($3 * ($1 + $2))) \
    -npp $1 -ntg $2 -npl $3 2>&1 | grep -E "^\|  *[0-9]|error|failed" | tee -a $OUT/llama_batched_c.txt
done
