#!/usr/bin/env bash
# gemm_rows with each warp's weights asked of L2 N steps beyond the next (cp.async.bulk.prefetch,
# SQUEEZEKV_CUDA_ROWS_AHEAD=N; out/dev): the q and gate products at 8 and 64 rows, then decode
# steps with --batch-invariant on, N alternated. 8B shape, bf16 dummy weights, f16 KV.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
C=bench/configs/llama-3.1-8b.json
for B in 8 64; do for N in 0 2 4 8; do
  echo "== B $B ahead $N" >> $OUT/ops.txt
  SQUEEZEKV_CUDA_BATCH=mma SQUEEZEKV_CUDA_ROWS_AHEAD=$N timeout 40 out/dev/squeezekv_bench_ops --device cuda --config $C --batch $B --depths 512 \
    --filter gemv --rounds 3 2>&1 | grep -E "x$B " >> $OUT/ops.txt
done; done
for N in 0 4 0 4; do
  echo "== ahead $N" >> $OUT/bench.txt
  for b in 1 64; do SQUEEZEKV_CUDA_ROWS_AHEAD=$N timeout 60 out/dev/squeezekv bench --dummy $C --device cuda -p 0 -r 3 -b $b -d 512 -n 32 --batch-invariant on 2>&1 | grep -E "^\| tg|rror" >> $OUT/bench.txt; done
done
for B in 8 64; do for N in 0 2 4 8; do printf "B %-3s ahead %s:" $B $N; grep -A8 "== B $B ahead $N$" $OUT/ops.txt | tail -8 | awk -F'|' '{printf " %s", $4+0}'; echo; done; done
cat $OUT/bench.txt
