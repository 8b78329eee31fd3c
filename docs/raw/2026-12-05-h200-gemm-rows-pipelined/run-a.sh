#!/usr/bin/env bash
# gemm_rows through shared-memory stages (this build, out/dev): cuda_test; each product alone at
# 1-128 rows on cuBLASLt as tuned (the default), on gemm_rows with 4 and with 3 stages; the new
# kernel under ncu; then decode batches on cuBLASLt and on gemm_rows, alternated twice.
# 8B shape, bf16 dummy weights, f16 KV.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
C=bench/configs/llama-3.1-8b.json
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $OUT/gpu.txt
timeout 200 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure|batched products" $OUT/cuda_test.txt | head -12
for v in tuned mma4 mma3; do
  case $v in
    tuned) export SQUEEZEKV_CUDA_BATCH=tuned ;;
    mma4) export SQUEEZEKV_CUDA_BATCH=mma SQUEEZEKV_CUDA_ROWS_STAGES=4 ;;
    mma3) export SQUEEZEKV_CUDA_BATCH=mma SQUEEZEKV_CUDA_ROWS_STAGES=3 ;;
  esac
  echo "== $v" >> $OUT/ops.txt
  timeout 100 out/dev/squeezekv_bench_ops --device cuda --config $C --batch 1,16,64,128 --depths 512 --filter gemv --rounds 3 >> $OUT/ops.txt 2>&1
done
unset SQUEEZEKV_CUDA_ROWS_STAGES
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,launch__registers_per_thread,launch__occupancy_limit_shared_mem,launch__grid_size,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio
for F in "gemv q x64"; do
  echo "== $F" >> $OUT/ncu.txt
  SQUEEZEKV_CUDA_BATCH=mma timeout 60 ncu --clock-control none --kernel-name regex:k_gemm_rows --launch-skip 3 --launch-count 1 --metrics $M \
    out/dev/squeezekv_bench_ops --device cuda --config $C --batch 64 --depths 512 --filter "$F" --rounds 1 >> $OUT/ncu.txt 2>&1
done
grep -E "^==|duration|dram__|warps_active|hmma|bank_conflicts|registers|occupancy_limit|grid_size|stalled" $OUT/ncu.txt | awk '/^==|duration|dram|hmma|bank|regis|occup|grid|warps_active/ || $NF+0 > 0.3' | head -50
sb() { timeout 120 out/dev/squeezekv bench --dummy $C --device cuda -p 0 -r 3 "$@" 2>&1 | grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
for round in 1 2; do
  for v in tuned mma; do
    echo "== $v round $round" >> $OUT/bench.txt
    export SQUEEZEKV_CUDA_BATCH=$v
    sb -b 64,128 -d 512 -n 64
    [ $round = 1 ] && sb -b 16 -d 512 -n 64
    [ $round = 1 ] && sb -b 64 -d 4096 -n 32 --kv-policy squeeze --kv-budget 1024
    [ $round = 1 ] && sb -d 0 -n 64
  done
done
cat $OUT/bench.txt
python3 - $OUT/ops.txt <<'PY'
import sys, re
mode = None; rows = {}
for line in open(sys.argv[1]):
    if line.startswith("== "): mode = line[3:].strip(); continue
    m = re.match(r"\|\s*(gemv [^|]*?)\s*\|", line)
    if m and mode: rows.setdefault(m.group(1), {})[mode] = line.split("|")[3].strip()
for k, v in rows.items(): print(f"{k:24s}", "  ".join(f"{m}={v.get(m, '-')}" for m in ("tuned", "mma4", "mma3")))
PY
