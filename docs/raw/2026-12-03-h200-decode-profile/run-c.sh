#!/usr/bin/env bash
# cuBLASLt's decode-batch products timed over more of its heuristic's candidates
# (SQUEEZEKV_CUDA_LT_ALGOS 8, the default, against 32 and 64; alternated twice), each product
# alone at 64 rows with 64 candidates, and k_split_rows and k_attn_merge_batch in detail (ncu).
set -u
lib() { echo "$PWD/out/$1/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64"; }
export LD_LIBRARY_PATH=$(lib dev)
C=bench/configs/llama-3.1-8b.json
for round in 1 2; do
  for n in 8 32 64; do
    echo "== algos $n round $round" >> $OUT/bench_c.txt
    SQUEEZEKV_CUDA_LT_ALGOS=$n out/dev/squeezekv bench --dummy $C --device cuda -b 64,128 -p 0 -d 512 -n 64 -r 3 2>&1 | grep "^|" >> $OUT/bench_c.txt
  done
done
grep -E "==|tg" $OUT/bench_c.txt
SQUEEZEKV_CUDA_LT_ALGOS=64 out/dev/squeezekv_bench_ops --device cuda --config $C --batch 64 --depths 512 --filter gemv --rounds 5 > $OUT/ops_c64.txt 2>&1
grep x64 $OUT/ops_c64.txt
for k in k_split_rows k_attn_merge_batch; do
  timeout 100 ncu --clock-control none --kernel-name regex:$k --launch-skip 40 --launch-count 1 --set full \
    out/dev/squeezekv bench --dummy $C --device cuda -b 64 -p 0 -d 512 -n 2 -r 1 --no-warmup --cuda-graphs off > $OUT/ncu_$k.txt 2>&1
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|Executed Ipc A|Local" $OUT/ncu_$k.txt | head -12
done
