#!/usr/bin/env bash
# Where a step of 128 sequences goes (issue 26): the same steps with matrices too small to cost
# anything (bench/configs/launch-floor-32layer.json: the host's and the launches' share), full
# cache against squeeze at the same rows held; on the 8B shape, 128 sequences holding 2048 rows
# each, full (depth 2048) against squeeze 2048 (depth 4096); the ops alone at 128 rows/sequences.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
b() { echo "== $*"; timeout 200 out/dev/squeezekv bench --device cuda "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_b.txt; }
F="--dummy bench/configs/launch-floor-32layer.json -p 0 -n 32 -r 3"
for round in 1 2; do
  b $F -d 2048 --ctx 2112 -b 64,128,256
  b $F -d 2048 --ctx 2112 -b 64,128,256 --kv-policy squeeze --kv-budget 1024
  b $F -d 2048 --ctx 2112 -b 64,128,256 --kv-policy h2o --kv-budget 1024
done
E="--dummy bench/configs/llama-3.1-8b.json -p 0 -n 16 -r 3"
b $E -d 2048 --ctx 2112 -b 128
b $E -d 4096 --ctx 4160 -b 128 --kv-policy squeeze --kv-budget 2048
b $E -d 4096 --ctx 4160 -b 128 --kv-policy h2o --kv-budget 2048
b $E -d 4096 --ctx 4160 -b 128 --kv-policy window --kv-budget 2048
echo "== ops"; timeout 150 out/dev/squeezekv_bench_ops --device cuda --config bench/configs/llama-3.1-8b.json --depths 2048 --batch 128 --rounds 3 2>&1 | tee $OUT/ops_b.txt | grep -v "^|---"
