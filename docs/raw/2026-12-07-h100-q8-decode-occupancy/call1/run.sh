#!/usr/bin/env bash
# The tensor-core decode kernel over Q8_0 rows at 12 warps an SM (issue 26): cuda_test of this
# build, then three builds alternated on one card: `base` (the build before), `v1` (whole tiles
# copied without bounds, the accumulators no longer zeroed at every tile; 8 warps an SM, 6 stages)
# and `dev` (v1 with Q8_0 rows at 12 warps an SM, 4 stages). Each op alone
# (`squeezekv_bench_ops --filter "attn decode"`, 64 sequences of 1024 q8_0 rows, 512 f16 rows),
# then steps (`squeezekv bench`, 8B shape, random BF16 weights): 64 x 4096 under squeeze 1024 over
# q8_0 rows, one sequence at depth 32768 over q8_0 and f16 rows, 64 x 4096 full f16; then
# Nsight Compute's counters of dev's kernel at 64 x 1024 q8_0 where time is left.
# Carry: out/devsys.tar.xz (dev/ with squeezekv, squeezekv_bench_ops, cuda_test; base/lib, v1/lib;
# sys/lib).   OUT=DIR [LIMIT=s] bash run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-560} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
LIBS=$PWD/out/sys/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=bench/configs/llama-3.1-8b.json
ops() { local b=$1; shift; echo "== $b squeezekv_bench_ops $*" >> $OUT/ops.txt; el "$b ops $*"
  LD_LIBRARY_PATH=$PWD/out/$b/lib:$LIBS timeout 60 out/dev/squeezekv_bench_ops --device cuda --config $C --rounds 5 --filter "attn decode" "$@" 2>&1 |
    grep -E "x64|rror" >> $OUT/ops.txt; }
ours() { local b=$1; shift; echo "== $b squeezekv $*" >> $OUT/bench.txt; el "$b $*"
  LD_LIBRARY_PATH=$PWD/out/$b/lib:$LIBS timeout 100 out/dev/squeezekv bench --device cuda --dummy $C -r 3 "$@" 2>&1 |
    grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
el "cuda_test"
LD_LIBRARY_PATH=$PWD/out/dev/lib:$LIBS timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED" $OUT/cuda_test.txt | head -20
SQ="-p 0 -n 32 -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024 --kv-type q8_0"
for r in 1 2; do
  echo "# round $r" >> $OUT/ops.txt; echo "# round $r" >> $OUT/bench.txt
  for b in base v1 dev; do left 30 && ops $b --batch 64 --depths 1024 --kv-type q8_0; done
  for b in base v1 dev; do left 40 && ours $b $SQ; done
done
for b in base dev; do left 30 && ops $b --batch 64 --depths 512; done
for b in base dev; do left 40 && ours $b -p 0 -n 32 -d 32768 --kv-type q8_0; done
for b in base dev; do left 40 && ours $b -p 0 -n 32 -d 32768; done
for b in base dev; do left 40 && ours $b -p 0 -n 32 -b 64 -d 4096; done
cat $OUT/ops.txt $OUT/bench.txt
if left 80; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  LD_LIBRARY_PATH=$PWD/out/dev/lib:$LIBS timeout 70 $NCU --clock-control none -k regex:decode_mma_batch -c 1 --print-details all \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis_Tables \
    --section InstructionStats out/dev/squeezekv_bench_ops --device cuda --config $C --rounds 1 --filter "attn decode x64" \
    --batch 64 --depths 1024 --kv-type q8_0 > $OUT/ncu_dev_q8.txt 2>&1
  el "ncu rc $?"; grep -E "Duration|Throughput|Achieved Occupancy|Issued Warp|No Eligible|Bank|Stall|Warp Cycles Per Issued" $OUT/ncu_dev_q8.txt | head -30
fi
el done
