#!/usr/bin/env bash
# A decode batch's tensor-core blocks folding whole runs of splits (one partial a run; issue 26),
# on one card in one call: cuda_test of this build, then the build before (out/a: libraries only),
# this build (out/dev) and this build with one partial a split (SQUEEZEKV_CUDA_DECODE_RUNS=0)
# alternated, two rounds: 64 sequences at 4096 (full f16; squeeze 1024 over q8_0 rows), one
# sequence at depth 32768 (the lone path: the merge's arithmetic changed, its partials did not;
# depth 4096 once at the end where time is left); then llama.cpp CUDA (built here meanwhile from the llama-cpp-python 0.3.36 sdist)
# beside this build: `llama-batched-bench` 64 x 4096 (and 64 x 512 if time is left) and `llama-bench -d 32768`. 8B shape, random
# BF16 weights (ours --dummy, theirs a GGUF of the same shape from bench/make_dummy_gguf.py).
# Carry: out/devsys.tar.xz (dev/ with squeezekv, cuda_test and the tiny models; a/lib; sys/lib),
# out/peer/llama-src.tar.xz and out/peer/gguf-py (bench/cuda/stage_device.sh --peer).
#   OUT=DIR [LIMIT=s] bash docs/raw/2026-12-07-decode-runs/run.sh
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
  timeout 400 cmake --build out/peer/build -j 12 --target llama-bench llama-batched-bench >> /tmp/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt; tail -3 /tmp/llama_build.txt >> $OUT/llama_build_rc.txt ) &
g=/dev/shm/gguf; mkdir -p $g
( PYTHONPATH=out/peer/gguf-py timeout 200 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json $g/8b.BF16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $?" >> $OUT/gguf.txt ) &
C=bench/configs/llama-3.1-8b.json
# ours BUILD [env ...] -- bench args: BUILD a (the build before) or dev
ours() { local b=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "== $b ${envs[*]} squeezekv $*" >> $OUT/bench.txt; el "$b ${envs[*]} $*"
  env "${envs[@]}" LD_LIBRARY_PATH=$PWD/out/$b/lib:$LIBS timeout 150 out/dev/squeezekv bench --device cuda --dummy $C -r 3 "$@" 2>&1 |
    grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
bench1() { echo "== llama-bench $*" >> $OUT/bench.txt; el "llama-bench $*"
  LD_LIBRARY_PATH=$LL timeout 200 out/peer/build/bin/llama-bench -m $g/8b.BF16.gguf -ngl 99 -fa 1 -r 3 "$@" 2>&1 | grep -E "^\| |rror" >> $OUT/bench.txt; }
batched() { echo "== llama-batched-bench $*" >> $OUT/bench.txt; el "llama-batched-bench $*"
  LD_LIBRARY_PATH=$LL timeout 200 out/peer/build/bin/llama-batched-bench -m $g/8b.BF16.gguf -ngl 99 -fa on -pps -ntg 32 "$@" 2>&1 | grep -E "^\| |rror" >> $OUT/bench.txt; }
el "cuda_test (llama.cpp building beside it)"
LD_LIBRARY_PATH=$PWD/out/dev/lib:$LIBS timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED|runs folded" $OUT/cuda_test.txt | head -20
B64="-p 0 -n 32 -b 64 -d 4096" SQ="--kv-policy squeeze --kv-budget 1024 --kv-type q8_0"
for r in 1 2; do
  echo "# round $r" >> $OUT/bench.txt
  for b in a dev dev0; do
    e=(); [ $b = dev0 ] && e=(SQUEEZEKV_CUDA_DECODE_RUNS=0); bb=${b%0}
    left 40 && ours $bb "${e[@]}" -- $B64
  done
  for b in dev a; do left 40 && ours $b -- $B64 $SQ; done
  for b in a dev; do left 40 && ours $b -- -p 0 -n 32 -d 32768; done
done
wait; cat $OUT/llama_build_rc.txt $OUT/gguf.txt
echo "# beside llama.cpp" >> $OUT/bench.txt
left 90 && batched -c 266000 -npp 4096 -npl 64
left 40 && ours dev -- $B64
left 60 && bench1 -p 0 -n 32 -d 32768
left 40 && ours dev -- -p 0 -n 32 -d 32768
left 40 && ours dev -- $B64 $SQ
for b in dev a; do left 30 && ours $b -- -p 0 -n 64 -d 4096; done
left 60 && batched -c 70000 -npp 512 -npl 64
left 30 && ours dev -- -p 0 -n 32 -b 64 -d 512
cat $OUT/bench.txt
el done
