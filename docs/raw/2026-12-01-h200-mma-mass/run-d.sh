#!/usr/bin/env bash
# 2026-12-01, commit a2dbf97: kernel times of an h2o prompt (8B shape, pp2048, budget 1024) under ncu: the
# tensor-core attention against its mass pass.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
ncu --version | tail -1
timeout 400 ncu --clock-control none -k "regex:k_attn_mma|k_kv_move" --launch-skip 64 --launch-count 12 \
  --section SpeedOfLight --section Occupancy --section LaunchStats \
  out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 2048 -n 1 -d 0 -r 1 --kv-policy h2o --kv-budget 1024 \
  > $OUT/ncu_h2o.txt 2>&1
echo "rc $?"
grep -E "k_attn_mma|k_kv_move|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit Shared|Grid Size" $OUT/ncu_h2o.txt | head -80
