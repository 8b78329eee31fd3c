#!/usr/bin/env bash
# gemm_rows with the weights streamed into registers as mma's A operand (out/dev): cuda_test, then
# each product alone at 8-128 rows on cuBLASLt as tuned and on gemm_rows with steps of 128 and 64
# columns, then whole decode steps with the products on each, alternated twice. 8B shape, bf16
# dummy weights, f16 KV.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
C=bench/configs/llama-3.1-8b.json
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $OUT/gpu.txt
timeout 200 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure|batched products" $OUT/cuda_test.txt | head -12
ops() { timeout 60 out/dev/squeezekv_bench_ops --device cuda --config $C --batch $1 --depths 512 --filter gemv --rounds 5 2>&1 | grep -E "x$1 " ; }
for B in 8 16 32 64 128; do
  echo "== B $B tuned" >> $OUT/ops.txt; ops $B >> $OUT/ops.txt
  echo "== B $B mma 128" >> $OUT/ops.txt; SQUEEZEKV_CUDA_BATCH=mma ops $B >> $OUT/ops.txt
  echo "== B $B mma 64" >> $OUT/ops.txt; SQUEEZEKV_CUDA_BATCH=mma SQUEEZEKV_CUDA_ROWS_STEP=64 ops $B >> $OUT/ops.txt
done
sb() { timeout 120 out/dev/squeezekv bench --dummy $C --device cuda -p 0 -r 3 "$@" 2>&1 | grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
for round in 1 2; do
  for v in tuned mma64 mma; do
    echo "== $v round $round" >> $OUT/bench.txt
    case $v in tuned) b=tuned; st=128 ;; mma) b=mma; st=128 ;; mma64) b=mma; st=64 ;; esac
    export SQUEEZEKV_CUDA_BATCH=$b SQUEEZEKV_CUDA_ROWS_STEP=$st
    sb -b 64 -d 512 -n 64
    sb -b 16 -d 512 -n 64
    sb -b 64 -d 4096 -n 32 --kv-policy squeeze --kv-budget 1024
  done
done
unset SQUEEZEKV_CUDA_BATCH SQUEEZEKV_CUDA_ROWS_STEP
cat $OUT/ops.txt | awk '{print $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14}' | head -80
cat $OUT/bench.txt
