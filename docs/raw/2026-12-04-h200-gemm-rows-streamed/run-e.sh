#!/usr/bin/env bash
# Where gemm_rows's time goes (the committed build, out/dev): the q product (4096 x 4096) at 8 and
# 64 rows and the gate (14336 x 4096) at 64 under ncu: time, DRAM throughput, the tensor pipe's
# use, occupancy, shared-memory bank conflicts and the warps' stall reasons.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
C=bench/configs/llama-3.1-8b.json
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__grid_size,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio
for spec in "8:gemv q x8" "64:gemv q x64" "64:gemv gate x64"; do
  B=${spec%%:*}; F=${spec#*:}
  echo "== $F" | tee -a $OUT/ncu.txt
  SQUEEZEKV_CUDA_BATCH=mma timeout 150 ncu --clock-control none --kernel-name regex:k_gemm_rows --launch-skip 3 --launch-count 1 --metrics $M \
    out/dev/squeezekv_bench_ops --device cuda --config $C --batch $B --depths 512 --filter "$F" --rounds 1 >> $OUT/ncu.txt 2>&1
done
grep -E "^==|duration|dram__|inst_executed|warps_active|hmma|bank_conflicts|registers|occupancy_limit|grid_size|stalled" $OUT/ncu.txt | awk '/^==|duration|dram|inst|hmma|bank|regis|occup|grid|warps_active/ || $NF+0 > 0.3' | head -90
