#!/usr/bin/env bash
# SwiGLU's gate written in bf16 alone where the down product reads only that (matmul_swiglu's
# next; CudaOptions::gate_bf16_only, the default since this folder's commit) against the same
# build writing it in f32 too (SQUEEZEKV_CUDA_GATE_BF16=0), alternated, 8B shape bf16, one device
# call; cuda_test first. Carry: out/devsys.tar.xz (dev/, sys/lib).
#   OUT=DIR bash docs/raw/2026-12-06-h100-gate-bf16/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-150} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
el "cuda_test"
timeout 60 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure" $OUT/cuda_test.txt | head -12
C=bench/configs/llama-3.1-8b.json
ours() { echo "== squeezekv SQUEEZEKV_CUDA_GATE_BF16=$1 $2" >> $OUT/bench.txt
  SQUEEZEKV_CUDA_GATE_BF16=$1 timeout 40 out/dev/squeezekv bench --device cuda --dummy $C -r 3 $2 2>&1 | grep -E "^\| (pp|tg)|rror" >> $OUT/bench.txt; }
for r in 1 2; do
  el "round $r"
  if [ $r = 1 ]; then a=1 b=0; else a=0 b=1; fi
  left 20 && ours $a "-p 512,4096 -n 0"
  left 20 && ours $b "-p 512,4096 -n 0"
  left 25 && ours $a "-p 0 -n 16 -b 128 -d 512"
  left 25 && ours $b "-p 0 -n 16 -b 128 -d 512"
done
cat $OUT/bench.txt
el done
