#!/usr/bin/env bash
# A decode batch's attention split by the batch instead of by each lone sequence (issue 26;
# CudaOptions::batch_lone_splits, off by default, on with --batch-invariant): cuda_test of this
# build, then `squeezekv bench --device cuda` on the 8B shape with random BF16 weights, each
# sequence's keys split as alone (SQUEEZEKV_CUDA_BATCH_SPLITS=lone) and split by the batch
# (=batch, this build's default) alternated, two rounds: 64 sequences at depth 4096 (full f16;
# squeeze 1024 over q8_0 rows) and 128 at 512. squeezekv alone (llama.cpp's figures of the same
# shapes: docs/PERFORMANCE.md). Carry: out/devsys.tar.xz (bench/cuda/stage_device.sh).
#   OUT=DIR [LIMIT=s CUDA_TEST=1 SMALL=1] bash docs/raw/2026-12-07-h100-batch-splits/run.sh  (0: without cuda_test, the 128 x 512 runs)
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-300} - ($(date +%s) - T0) )) -ge "$1" ]; }
[ -x out/dev/squeezekv ] || tar xJf out/devsys.tar.xz -C out
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ "${CUDA_TEST:-1}" = 1 ]; then
  el "cuda_test"; timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
  grep -E "FAILED|PASSED|batch 64:|batch 8:" $OUT/cuda_test.txt | head -20
fi
C=bench/configs/llama-3.1-8b.json
ours() { local s=$1; shift; echo "== SQUEEZEKV_CUDA_BATCH_SPLITS=$s squeezekv $*" >> $OUT/bench.txt; el "$s $*"
  SQUEEZEKV_CUDA_BATCH_SPLITS=$s timeout 150 out/dev/squeezekv bench --device cuda --dummy $C -r 3 "$@" 2>&1 |
    grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
B64="-p 0 -n 32 -b 64 -d 4096" SQ="--kv-policy squeeze --kv-budget 1024 --kv-type q8_0"
for r in 1 2; do
  echo "# round $r" >> $OUT/bench.txt
  for s in lone batch; do left 30 && ours $s $B64; done
  for s in batch lone; do left 30 && ours $s $B64 $SQ; done
  [ "${SMALL:-1}" = 1 ] && for s in lone batch; do left 30 && ours $s -p 0 -n 32 -b 128 -d 512; done
done
cat $OUT/bench.txt
el done
