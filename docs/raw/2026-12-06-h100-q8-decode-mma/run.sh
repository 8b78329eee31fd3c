#!/usr/bin/env bash
# Q8_0 KV rows on the tensor-core decode kernel (attn_decode_mma.cu's Q8Rows) against f16 rows
# and against the CUDA-core Q8_0 kernel (SQUEEZEKV_CUDA_MMA_DECODE=0), one build, alternated, at
# depth 32768 (one sequence, full cache) and 64 x 4096; a sequence's blocks an SM 4 (the default)
# and 8 (SQUEEZEKV_CUDA_DECODE_BLOCKS=8); cuda_test first. One device call. (llama.cpp's build,
# 40 MiB, did not fit beside the tree and this build in the call's 64 MiB.)
# Carry: out/devsys.tar.xz (dev/, sys/lib).   OUT=DIR bash docs/raw/2026-12-06-h100-q8-decode-mma/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-570} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee $OUT/gpu.txt
el "cuda_test"
timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure|decode attention|q8_0 rows|batch" $OUT/cuda_test.txt | head -30
C=bench/configs/llama-3.1-8b.json
ours() { echo "== squeezekv $1 $2" >> $OUT/bench.txt
  env $1 timeout 100 out/dev/squeezekv bench --device cuda --dummy $C -p 0 -n 32 -r 3 $2 2>&1 | grep -E "^\| tg|rror" >> $OUT/bench.txt; }
F16="--kv-type f16" Q8="--kv-type q8_0"
for r in 1 2 3; do
  el "round $r"
  left 40 && ours SQUEEZEKV_CUDA_DECODE_BLOCKS=4 "$F16 -d 32768"
  left 40 && ours SQUEEZEKV_CUDA_DECODE_BLOCKS=4 "$Q8 -d 32768"
  left 40 && ours SQUEEZEKV_CUDA_DECODE_BLOCKS=8 "$Q8 -d 32768"
  left 40 && ours SQUEEZEKV_CUDA_DECODE_BLOCKS=8 "$F16 -d 32768"
  left 40 && ours SQUEEZEKV_CUDA_MMA_DECODE=0 "$Q8 -d 32768"
  left 60 && ours SQUEEZEKV_CUDA_DECODE_BLOCKS=4 "$F16 -b 64 -d 4096"
  left 60 && ours SQUEEZEKV_CUDA_DECODE_BLOCKS=4 "$Q8 -b 64 -d 4096"
  left 60 && ours SQUEEZEKV_CUDA_MMA_DECODE=0 "$Q8 -b 64 -d 4096"
done
cat $OUT/bench.txt
el done
