#!/usr/bin/env bash
# run-a.sh cut to fit what was left of a session's device time (its cuda_test passed in the same
# build's call of docs/raw/2026-12-05-h100-squeeze-step/run-a.sh): decode batches on cuBLASLt
# (the default) and on gemm_rows (--batch-invariant's products) alternated twice; each product
# alone on cuBLASLt and on gemm_rows with 4 and 3 stages; the kernel under ncu. 8B shape, bf16.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
C=bench/configs/llama-3.1-8b.json
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $OUT/gpu.txt
for round in 1 2; do
  for v in tuned mma; do
    echo "== $v round $round" >> $OUT/bench.txt
    SQUEEZEKV_CUDA_BATCH=$v timeout 150 out/dev/squeezekv bench --dummy $C --device cuda -p 0 -r 3 -b 1,16,64,128 -d 512 -n 32 2>&1 | grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt
  done
done
cat $OUT/bench.txt
for v in tuned mma4 mma3; do
  case $v in
    tuned) export SQUEEZEKV_CUDA_BATCH=tuned ;;
    mma4) export SQUEEZEKV_CUDA_BATCH=mma SQUEEZEKV_CUDA_ROWS_STAGES=4 ;;
    mma3) export SQUEEZEKV_CUDA_BATCH=mma SQUEEZEKV_CUDA_ROWS_STAGES=3 ;;
  esac
  echo "== $v" >> $OUT/ops.txt
  timeout 60 out/dev/squeezekv_bench_ops --device cuda --config $C --batch 1,64,128 --depths 512 --filter gemv --rounds 2 >> $OUT/ops.txt 2>&1
done
unset SQUEEZEKV_CUDA_ROWS_STAGES
python3 - $OUT/ops.txt <<'PY'
import sys, re
mode = None; rows = {}
for line in open(sys.argv[1]):
    if line.startswith("== "): mode = line[3:].strip(); continue
    m = re.match(r"\|\s*(gemv [^|]*?)\s*\|", line)
    if m and mode: rows.setdefault(m.group(1), {})[mode] = line.split("|")[3].strip()
for k, v in rows.items(): print(f"{k:24s}", "  ".join(f"{m}={v.get(m, '-')}" for m in ("tuned", "mma4", "mma3")))
PY
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size
SQUEEZEKV_CUDA_BATCH=mma timeout 60 ncu --clock-control none --kernel-name regex:k_gemm_rows --launch-skip 3 --launch-count 1 --metrics $M \
  out/dev/squeezekv_bench_ops --device cuda --config $C --batch 64 --depths 512 --filter "gemv q x64" --rounds 1 > $OUT/ncu.txt 2>&1
grep -E "duration|dram__|warps_active|hmma|registers|grid_size" $OUT/ncu.txt | head
