#!/usr/bin/env bash
# 2026-11-30, commit 3d240b4 run 2: where the squeeze 2048 decode step at 8192 spends its time (build n): ncu
# durations of the decode-side kernels (steady state: every decode step holds 2049 keys), then
# the decode attention's sections (occupancy, warp stalls, memory) for a few launches.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/n/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64
B=out/dev/squeezekv
C=bench/configs/llama-3.1-8b.json
X="--kv-policy squeeze --kv-budget 2048"
t0=$(date +%s)
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum"
timeout 200 ncu --csv --clock-control none --cache-control none --metrics $M -k regex:"k_attn_decode|k_attn_merge|k_attn_mass|k_kv_evict_one|k_kv_write" --launch-skip 640 --launch-count 320 \
  $B bench --device cuda --cuda-graphs off --dummy $C -p 0 -n 64 -d 8192 -r 1 $X > $OUT/ncu_sq8k.csv 2>$OUT/ncu_sq8k.err
echo "== sums ($(( $(date +%s) - t0 )) s)"; python3 out/dev/ncu_sum.py $OUT/ncu_sq8k.csv | head -12; tail -2 $OUT/ncu_sq8k.err
timeout 200 ncu --clock-control none --cache-control none --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SpeedOfLight \
  -k regex:"k_attn_decode|k_attn_mass" --launch-skip 400 --launch-count 4 \
  $B bench --device cuda --cuda-graphs off --dummy $C -p 0 -n 64 -d 8192 -r 1 $X > $OUT/ncu_dec_sections.txt 2>$OUT/ncu_dec_sections.err
echo "== sections ($(( $(date +%s) - t0 )) s)"; grep -E "k_attn|Duration|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|No Eligible|Stall|Grid Size|Waves" $OUT/ncu_dec_sections.txt | head -60
