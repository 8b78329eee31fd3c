#!/usr/bin/env bash
# Issue 26's scorecard against llama.cpp CUDA on one card in one call, the build of commit 685ec1e
# (a decode batch's attention split by the batch, b7742f7): cuda_test first (its
# DecodeBatchSplitByTheBatchWithinRounding had not run on a GPU yet) while llama.cpp builds from
# the llama-cpp-python 0.3.36 sdist (llama-bench, llama-batched-bench) and a first round of ours
# runs; then the engines alternated, two rounds: one sequence (prompt 512, decode 64 at depth 0,
# decode at depth 32768 with f16 and q8_0 K/V rows: `llama-bench -ngl 99 -fa 1 [-ctk q8_0 -ctv
# q8_0]`) and many (`llama-batched-bench -ngl 99 -fa on -pps -ntg 32`: 64 x 512, 64 x 4096 full;
# ours also 64 x 4096 under squeeze 1024 with f16 and q8_0 rows, 128 x 32768 under squeeze 2048).
# 8B shape, random BF16 weights (ours --dummy, theirs a GGUF of the shape from bench/make_dummy_gguf.py).
# Carry: out/devsys.tar.xz, out/peer (bench/cuda/stage_device.sh --peer).
#   OUT=DIR [LIMIT=s] bash docs/raw/2026-12-07-gpu-scorecard/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-570} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
LL=$PWD/out/peer/build/bin:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > /tmp/llama_build.txt 2>&1 &&
  timeout 420 cmake --build out/peer/build -j 14 --target llama-bench llama-batched-bench >> /tmp/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt; tail -3 /tmp/llama_build.txt >> $OUT/llama_build_rc.txt ) &
g=/dev/shm/gguf; mkdir -p $g
( PYTHONPATH=out/peer/gguf-py timeout 200 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json $g/8b.BF16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $?" >> $OUT/gguf.txt ) &
C=bench/configs/llama-3.1-8b.json
ours() { echo "== squeezekv $*" >> $OUT/bench.txt; el "ours $*"
  timeout 150 out/dev/squeezekv bench --device cuda --dummy $C -r 3 "$@" 2>&1 | grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
bench1() { echo "== llama-bench $*" >> $OUT/bench.txt; el "llama-bench $*"
  LD_LIBRARY_PATH=$LL timeout 200 out/peer/build/bin/llama-bench -m $g/8b.BF16.gguf -ngl 99 -fa 1 -r 3 "$@" 2>&1 | grep -E "^\| |rror" >> $OUT/bench.txt; }
batched() { echo "== llama-batched-bench $*" >> $OUT/bench.txt; el "llama-batched-bench $*"
  LD_LIBRARY_PATH=$LL timeout 200 out/peer/build/bin/llama-batched-bench -m $g/8b.BF16.gguf -ngl 99 -fa on -pps -ntg 32 "$@" 2>&1 | grep -E "^\| |rror" >> $OUT/bench.txt; }
el "cuda_test (llama.cpp building beside it)"
timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED|SplitByTheBatch" $OUT/cuda_test.txt | head
echo "# round 0: llama.cpp building beside it" >> $OUT/bench.txt
ours -p 0 -n 32 -b 128 -d 32768 --kv-policy squeeze --kv-budget 2048
ours -p 0 -n 32 -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024 --kv-type q8_0
ours -p 0 -n 32 -b 64 -d 4096
ours -p 0 -n 32 -b 64 -d 512
wait; cat $OUT/llama_build_rc.txt $OUT/gguf.txt
for r in 1 2; do
  echo "# round $r" >> $OUT/bench.txt; el "round $r"
  left 80 && batched -c 266000 -npp 4096 -npl 64
  left 30 && ours -p 0 -n 32 -b 64 -d 4096
  left 30 && ours -p 0 -n 32 -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024 --kv-type q8_0
  left 30 && ours -p 0 -n 32 -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024
  left 50 && batched -c 70000 -npp 512 -npl 64
  left 30 && ours -p 0 -n 32 -b 64 -d 512
  left 50 && bench1 -p 512 -n 64
  left 30 && ours -p 512 -n 64 -d 0
  left 50 && bench1 -p 0 -n 32 -d 32768
  left 30 && ours -p 0 -n 32 -d 32768
  left 50 && bench1 -p 0 -n 32 -d 32768 -ctk q8_0 -ctv q8_0
  left 30 && ours -p 0 -n 32 -d 32768 --kv-type q8_0
done
left 40 && ours -p 0 -n 32 -b 128 -d 32768 --kv-policy squeeze --kv-budget 2048
cat $OUT/bench.txt
el done
