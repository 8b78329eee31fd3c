#!/usr/bin/env bash
# The decode attention's tile loop with fewer instructions (out/dev) against the build before
# (out/a, commit 6943cbb): cuda_test on the new build, then both alternated twice at the batch
# shapes issue 26 names, then each one's batched attention launch under ncu (time, DRAM, the
# instructions it issues and where its warps stall). 8B shape, bf16 dummy weights, f16 KV.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
lib() { echo "$PWD/out/$1/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64"; }
C=bench/configs/llama-3.1-8b.json
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $OUT/gpu.txt
LD_LIBRARY_PATH=$(lib dev) timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure" $OUT/cuda_test.txt | head -10
sb() { LD_LIBRARY_PATH=$(lib $1) timeout 120 out/dev/squeezekv bench --dummy $C --device cuda -p 0 -r 3 "${@:2}" 2>&1 | grep -E "^\| (tg|pp)|rror" >> $OUT/bench_a.txt; }
for round in 1 2; do
  for v in a dev; do
    echo "== $v round $round" >> $OUT/bench_a.txt
    sb $v -b 64 -d 4096 -n 32
    sb $v -b 64 -d 4096 -n 32 --kv-policy squeeze --kv-budget 1024
    sb $v -b 128 -d 32768 -n 32 --kv-policy squeeze --kv-budget 2048
    sb $v -b 64 -d 512 -n 64
    sb $v -d 32768 -n 64
  done
done
cat $OUT/bench_a.txt
for v in a dev; do
  LD_LIBRARY_PATH=$(lib $v) timeout 120 ncu --clock-control none --kernel-name regex:"k_attn_decode_mma_batch|k_attn_merge_batch" --launch-skip 40 --launch-count 2 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
    out/dev/squeezekv bench --dummy $C --device cuda -b 64 -p 0 -d 4096 -n 2 -r 1 --no-warmup --cuda-graphs off > $OUT/ncu_$v.txt 2>&1
  echo "== ncu $v"; grep -E "duration|dram__|inst_executed|warps_active|stalled" $OUT/ncu_$v.txt | awk '$NF+0 > 0.05 || /duration|dram|inst/' | head -30
done
