#!/usr/bin/env bash
# Issue 26 on one card in one call, beside llama.cpp CUDA built there (the llama-cpp-python 0.3.36
# sdist): the decode merge of a batch's whole rows in blocks of 4 warps (dev) against 8 (base,
# commit 0b76bf3), same arithmetic. cuda_test of dev while llama.cpp builds, a first A/B round;
# then rounds of: one sequence at depth 32768 (`llama-bench -ngl 99 -fa 1 -p 0 -n 32 -d 32768`,
# ours dev and base, and dev over q8_0 rows for issue 27's 1.08x), 64 x 4096 (`llama-batched-bench -ngl 99 -fa on -pps -ntg 32 -npp 4096
# -npl 64`, ours dev and base under squeeze 1024 over q8_0 rows and with the full cache), and the
# attention op alone for 64 sequences of 1024 q8_0 rows (`squeezekv_bench_ops --batch 64`); then
# Nsight Compute's duration of the merge kernels. Round 0 also runs one sequence at 32768 with fewer
# splits (SQUEEZEKV_CUDA_DECODE_BLOCKS=4 and 6 of the default 8 a kv head's blocks an SM). 8B shape, random BF16 weights (ours --dummy,
# theirs bench/make_dummy_gguf.py's GGUF of the shape).
# Carry: out/devsys.tar.xz (dev/ with squeezekv, squeezekv_bench_ops, cuda_test; base/lib; sys/lib), out/peer.
#   OUT=DIR [LIMIT=s] bash docs/raw/2026-12-08-gpu-merge-waves/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-570} - ($(date +%s) - T0) )) -ge "$1" ]; }
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
  timeout 420 cmake --build out/peer/build -j 14 --target llama-bench llama-batched-bench >> /tmp/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt; tail -3 /tmp/llama_build.txt >> $OUT/llama_build_rc.txt ) &
g=/dev/shm/gguf; mkdir -p $g
( PYTHONPATH=out/peer/gguf-py timeout 200 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json $g/8b.BF16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $?" >> $OUT/gguf.txt ) &
C=bench/configs/llama-3.1-8b.json
ours() { local b=$1; shift; echo "== $b squeezekv $*" >> $OUT/bench.txt; el "$b $*"
  LD_LIBRARY_PATH=$PWD/out/$b/lib:$LIBS timeout 100 out/dev/squeezekv bench --device cuda --dummy $C -r 3 "$@" 2>&1 |
    grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
ops() { local b=$1; shift; echo "== $b squeezekv_bench_ops $*" >> $OUT/ops.txt; el "$b ops $*"
  LD_LIBRARY_PATH=$PWD/out/$b/lib:$LIBS timeout 60 out/dev/squeezekv_bench_ops --device cuda --config $C --rounds 5 --filter "attn decode" "$@" 2>&1 |
    grep -E "attn decode|rror" >> $OUT/ops.txt; }
bench1() { echo "== llama-bench $*" >> $OUT/bench.txt; el "llama-bench $*"
  LD_LIBRARY_PATH=$LL timeout 120 out/peer/build/bin/llama-bench -m $g/8b.BF16.gguf -ngl 99 -fa 1 -r 3 "$@" 2>&1 | grep -E "^\| |rror" >> $OUT/bench.txt; }
batched() { echo "== llama-batched-bench $*" >> $OUT/bench.txt; el "llama-batched-bench $*"
  LD_LIBRARY_PATH=$LL timeout 120 out/peer/build/bin/llama-batched-bench -m $g/8b.BF16.gguf -ngl 99 -fa on -pps -ntg 32 "$@" 2>&1 | grep -E "^\| |rror" >> $OUT/bench.txt; }
SQ="-p 0 -n 32 -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024 --kv-type q8_0"
el "cuda_test dev (llama.cpp building beside it)"
LD_LIBRARY_PATH=$PWD/out/dev/lib:$LIBS timeout 120 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED" $OUT/cuda_test.txt | head -20
for r in a b; do  # while llama.cpp builds
  echo "# round 0$r: llama.cpp building beside it" >> $OUT/bench.txt; echo "# round 0$r" >> $OUT/ops.txt
  for b in base dev; do ours $b $SQ; done
  for b in base dev; do ops $b --batch 64 --depths 1024 --kv-type q8_0; done
  for b in base dev; do ours $b -p 0 -n 32 -d 32768; done
  for k in 4 6; do echo "# SQUEEZEKV_CUDA_DECODE_BLOCKS=$k" >> $OUT/bench.txt; SQUEEZEKV_CUDA_DECODE_BLOCKS=$k ours dev -p 0 -n 32 -d 32768; done
  for b in dev base; do ours $b $SQ; done
  for b in dev base; do ops $b --batch 64 --depths 1024 --kv-type q8_0; done
done
wait; cat $OUT/llama_build_rc.txt $OUT/gguf.txt
for r in 1 2; do
  echo "# round $r" >> $OUT/bench.txt; echo "# round $r" >> $OUT/ops.txt; el "round $r"
  left 60 && bench1 -p 0 -n 32 -d 32768
  for b in dev base; do left 20 && ours $b -p 0 -n 32 -d 32768; done
  left 20 && ours dev -p 0 -n 32 -d 32768 --kv-type q8_0
  left 60 && batched -c 266000 -npp 4096 -npl 64
  for b in dev base; do left 20 && ours $b $SQ; done
  left 20 && ours dev -p 0 -n 32 -b 64 -d 4096
done
for b in dev base; do  # the batch merge's duration under Nsight Compute (the op's first launches)
  left 30 || break
  echo "== $b" >> $OUT/ncu.txt
  LD_LIBRARY_PATH=$PWD/out/$b/lib:$LIBS timeout 40 ncu --clock-control none -k regex:"attn_merge" -c 3 --metrics gpu__time_duration.sum \
    out/dev/squeezekv_bench_ops --device cuda --config $C --rounds 1 --filter "attn decode" --batch 64 --depths 1024 --kv-type q8_0 2>&1 |
    grep -E "k_attn|duration|rror" >> $OUT/ncu.txt
done
cat $OUT/bench.txt $OUT/ops.txt $OUT/ncu.txt 2>/dev/null
el done
