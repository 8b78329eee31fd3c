#!/usr/bin/env bash
# Where a decode step of 64 sequences at depth 512 spends its time (8B shape, bf16 dummy):
# the step's time, each kernel's time and DRAM bytes under ncu (clocks and caches as in a real
# run), and each product's time at 64 rows alone (cuBLASLt as tuned, and gemm_rows).
set -x
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/base/lib:/usr/local/cuda/lib64
S=out/dev/squeezekv; O=out/dev/squeezekv_bench_ops; C=bench/configs/llama-3.1-8b.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > $OUT/gpu.txt
$S bench --dummy $C --device cuda -b 64 -p 0 -d 512 -n 64 -r 3 > $OUT/bench.txt 2>&1
$S bench --dummy $C --device cuda -b 64 -p 0 -d 512 -n 64 -r 3 --cuda-graphs off >> $OUT/bench.txt 2>&1
$O --device cuda --config $C --batch 64 --depths 512 --filter gemv --rounds 5 > $OUT/ops_tuned.txt 2>&1
SQUEEZEKV_CUDA_BATCH=mma $O --device cuda --config $C --batch 64 --depths 512 --filter gemv --rounds 5 > $OUT/ops_mma.txt 2>&1
$O --device cuda --config $C --batch 64 --depths 512 --rounds 5 > $OUT/ops_all.txt 2>&1
timeout 300 ncu --csv --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $S bench --dummy $C --device cuda -b 64 -p 0 -d 512 -n 2 -r 1 --no-warmup --cuda-graphs off > $OUT/ncu.csv 2> $OUT/ncu.err
tail -3 $OUT/ncu.err; wc -l $OUT/ncu.csv
cat $OUT/bench.txt | grep -E "tg|pp"
