#!/usr/bin/env bash
# The decode attention's warps (issue 26): the batch kernel as committed (8 warps for splits of at
# most 64 keys, 4 above: out/dev), 4 warps for every split (kDecShortSplit = 0: out/expB), and
# 4 warps with at most 128 registers a thread so 4 blocks fit an SM (__launch_bounds__(128, 4):
# out/expC). squeezekv_bench_ops (one sequence and batches of 8, 64, 256 at depth 512 and 4096),
# the libraries alternated; then the whole step (squeezekv bench -b 64) with out/dev and out/expC.
set -u
lib() { echo "$PWD/out/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64"; }
for v in dev expB expC; do echo "== $v"; LD_LIBRARY_PATH=$(lib $v) timeout 100 out/dev/squeezekv_bench_ops --device cuda --config bench/configs/llama-3.1-8b.json --depths 512,4096 --batch 8,64,256 --rounds 3 --filter "attn decode"; done 2>&1 | grep -v "^|---\|^| op\|^# copy" | tee $OUT/bench_ops_b.txt
for v in dev expC; do echo "== $v"; LD_LIBRARY_PATH=$(lib $v) timeout 200 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 0 -n 16 -d 512,4096 -r 2 -b 1,64 2>&1 | grep -E "^\| (pp|tg)|rror"; done 2>&1 | tee $OUT/bench_batch_b.txt
