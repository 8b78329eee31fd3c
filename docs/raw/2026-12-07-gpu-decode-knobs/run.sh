#!/usr/bin/env bash
# Issue 26's three open targets against the decode knobs the backend reads for measurements
# (src/backend/backend.cc): batch 1 at depth 32768 (f16 rows) with decode splits of 128 (the
# default), 256 and 512 keys at least (SQUEEZEKV_CUDA_DECODE_SPLIT_KEYS) and 0 (the kernel's own),
# 2 or 4 blocks an SM (SQUEEZEKV_CUDA_DECODE_BLOCKS); 64 x 4096 under squeeze 1024 with q8_0 rows
# with the split keys and cuBLASLt's candidates timed (SQUEEZEKV_CUDA_LT_ALGOS 8, the default, or
# 24); then each op of a 64-sequence step alone at 1024 and 512 keys (squeezekv_bench_ops).
# The build of this commit, 8B shape, random BF16 weights, two rounds alternated.
# Carry: out/devsys.tar.xz (bench/cuda/stage_device.sh).   OUT=DIR [ROUNDS=2] [OPS=1] bash run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
tar xJf out/devsys.tar.xz -C out
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=bench/configs/llama-3.1-8b.json
ours() { local env="$1"; shift; echo "== $env squeezekv $*" >> $OUT/bench.txt; el "$env $*"
  env $env timeout 120 out/dev/squeezekv bench --device cuda --dummy $C -r 3 "$@" 2>&1 | grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
for r in $(seq 1 ${ROUNDS:-2}); do
  echo "# round $r" >> $OUT/bench.txt
  for k in 128 256 512; do for b in 0 2 4; do
    ours "SQUEEZEKV_CUDA_DECODE_SPLIT_KEYS=$k SQUEEZEKV_CUDA_DECODE_BLOCKS=$b" -p 0 -n 32 -d 32768
  done; done
  for k in 128 256; do for a in 8 24; do
    ours "SQUEEZEKV_CUDA_DECODE_SPLIT_KEYS=$k SQUEEZEKV_CUDA_LT_ALGOS=$a" -p 0 -n 32 -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024 --kv-type q8_0
  done; done
done
[ "${OPS:-1}" = 1 ] || { el "done"; exit 0; }
el "ops"
timeout 120 out/dev/squeezekv_bench_ops --device cuda --config $C --batch 64 --depths 1024 --kv-type q8_0 --rounds 5 > $OUT/ops_64x1024_q8.txt 2>&1
timeout 120 out/dev/squeezekv_bench_ops --device cuda --config $C --batch 64 --depths 512 --rounds 5 > $OUT/ops_64x512_f16.txt 2>&1
el "done"
