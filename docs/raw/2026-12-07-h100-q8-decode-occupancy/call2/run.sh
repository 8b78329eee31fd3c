#!/usr/bin/env bash
# The tensor-core decode kernel over Q8_0 rows (issue 26), second call: cuda_test of `dev` and the
# decode tests of `v2c`, then four builds alternated on one card, each op alone
# (`squeezekv_bench_ops --filter "attn decode"`: 64 sequences of 1024 q8_0 rows; 512 f16 rows) and
# steps (`squeezekv bench`, 8B shape, random BF16 weights): 64 x 4096 under squeeze 1024 over q8_0
# rows, 64 x 512 full f16; then llama.cpp CUDA (built here meanwhile from the llama-cpp-python
# 0.3.36 sdist) beside `dev`: `llama-batched-bench` 64 x 4096 and 64 x 512.
#   base  the build before (commit 8aea765)
#   v1b   a whole tile's rows copied by unbounded cp.async at fixed offsets; the accumulators no
#         longer zeroed at every tile; 8 warps an SM, 6 stages (as base)
#   v2c   v1b with each key tile's scores summed in two chains (even and odd k-steps)
#   dev   v1b with Q8_0 rows at 12 warps an SM, 4 stages
# Carry: out/devsys.tar.xz (dev/ with squeezekv, squeezekv_bench_ops, cuda_test; base/lib,
# v1b/lib, v2c/lib; sys/lib), out/peer (bench/cuda/stage_device.sh --peer).
#   OUT=DIR [LIMIT=s] bash run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-560} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
LIBS=$PWD/out/sys/lib:/usr/local/cuda/lib64
LL=$PWD/out/peer/build/bin:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > /tmp/llama_build.txt 2>&1 &&
  timeout 400 cmake --build out/peer/build -j 12 --target llama-batched-bench >> /tmp/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt; tail -3 /tmp/llama_build.txt >> $OUT/llama_build_rc.txt ) &
g=/dev/shm/gguf; mkdir -p $g
( PYTHONPATH=out/peer/gguf-py timeout 200 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json $g/8b.BF16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $?" >> $OUT/gguf.txt ) &
C=bench/configs/llama-3.1-8b.json
ops() { local b=$1; shift; echo "== $b squeezekv_bench_ops $*" >> $OUT/ops.txt; el "$b ops $*"
  LD_LIBRARY_PATH=$PWD/out/$b/lib:$LIBS timeout 60 out/dev/squeezekv_bench_ops --device cuda --config $C --rounds 5 --filter "attn decode" "$@" 2>&1 |
    grep -E "x64|rror" >> $OUT/ops.txt; }
ours() { local b=$1; shift; echo "== $b squeezekv $*" >> $OUT/bench.txt; el "$b $*"
  LD_LIBRARY_PATH=$PWD/out/$b/lib:$LIBS timeout 100 out/dev/squeezekv bench --device cuda --dummy $C -r 3 "$@" 2>&1 |
    grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
batched() { echo "== llama-batched-bench $*" >> $OUT/bench.txt; el "llama-batched-bench $*"
  LD_LIBRARY_PATH=$LL timeout 200 out/peer/build/bin/llama-batched-bench -m $g/8b.BF16.gguf -ngl 99 -fa on -pps -ntg 32 "$@" 2>&1 | grep -E "^\| |rror" >> $OUT/bench.txt; }
el "cuda_test dev"
LD_LIBRARY_PATH=$PWD/out/dev/lib:$LIBS timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
LD_LIBRARY_PATH=$PWD/out/v2c/lib:$LIBS timeout 100 out/dev/cuda_test --gtest_filter='*Decode*:*Q8*:*Survivors*' > $OUT/cuda_test_v2c.txt 2>&1; el "cuda_test v2c rc $?"
grep -E "FAILED|PASSED" $OUT/cuda_test.txt $OUT/cuda_test_v2c.txt | head -20
SQ="-p 0 -n 32 -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024 --kv-type q8_0"
for r in 1 2; do
  echo "# round $r" >> $OUT/ops.txt; echo "# round $r" >> $OUT/bench.txt
  for b in base v1b v2c dev; do left 30 && ops $b --batch 64 --depths 1024 --kv-type q8_0; done
  for b in base dev; do left 30 && ops $b --batch 64 --depths 512; done
  for b in base v1b v2c dev; do left 40 && ours $b $SQ; done
done
for b in base dev; do left 40 && ours $b -p 0 -n 32 -b 64 -d 512; done
wait; cat $OUT/llama_build_rc.txt $OUT/gguf.txt
echo "# beside llama.cpp" >> $OUT/bench.txt
left 100 && batched -c 266000 -npp 4096 -npl 64
left 30 && ours dev $SQ
left 60 && batched -c 70000 -npp 512 -npl 64
left 30 && ours dev -p 0 -n 32 -b 64 -d 512
cat $OUT/ops.txt $OUT/bench.txt
el done
