#!/usr/bin/env bash
# Where a decode step of a batch spends its time: the decode products at 1, 8, 64 and 256 rows
# (tensor cores with SQUEEZEKV_CUDA_BATCH_MMA=1, else 4-row GEMV launches) and a batch's decode
# attention in one launch (squeezekv_bench_ops, Llama-3.1-8B shape), beside the whole step
# (squeezekv bench -b).
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
ops() { SQUEEZEKV_CUDA_BATCH_MMA=$1 timeout 200 out/dev/squeezekv_bench_ops --device cuda --config bench/configs/llama-3.1-8b.json --depths 512,4096 --batch $2 --rounds 3 --filter "$3"; }
{ echo "== batch_mma=1"; ops 1 1,8,64,256 gemv; ops 1 8,64,256 "attn decode x"; echo "== batch_mma=0"; ops 0 8,64 gemv; } 2>&1 | tee $OUT/bench_ops.txt
SQUEEZEKV_CUDA_BATCH_MMA=1 timeout 200 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 0 -n 32 -d 512 -r 2 -b 64 2>&1 | grep -E "^\| (pp|tg)|error" | tee $OUT/bench_batch_b.txt
