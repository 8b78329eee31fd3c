#!/usr/bin/env bash
# A norm's and SwiGLU's rows handed to the products in bf16 by the kernel that wrote them, and
# k_split_rows reading its table in place (__grid_constant__): the whole cuda_test on this build
# (out/dev), then the build before (out/a) and this one alternated (8B shape, bf16 dummy), then
# this build's kernels under ncu and one batched decode attention launch in detail.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
lib() { echo "$PWD/out/$1/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64"; }
C=bench/configs/llama-3.1-8b.json
echo "== cuda_test"
LD_LIBRARY_PATH=$(lib dev) timeout 150 out/dev/cuda_test > $OUT/cuda_test_b.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|products after" $OUT/cuda_test_b.txt | head -20
for round in 1 2; do
  for build in a dev; do
    echo "== $build round $round" >> $OUT/bench_b.txt
    LD_LIBRARY_PATH=$(lib $build) out/$build/squeezekv bench --dummy $C --device cuda -b 64,128 -p 0 -d 512 -n 64 -r 3 2>&1 | grep "^|" >> $OUT/bench_b.txt
    LD_LIBRARY_PATH=$(lib $build) out/$build/squeezekv bench --dummy $C --device cuda -p 512 -n 128 -r 3 2>&1 | grep "^|" >> $OUT/bench_b.txt
  done
done
grep -E "==|tg|pp" $OUT/bench_b.txt
export LD_LIBRARY_PATH=$(lib dev)
timeout 200 ncu --csv --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  out/dev/squeezekv bench --dummy $C --device cuda -b 64 -p 0 -d 512 -n 2 -r 1 --no-warmup --cuda-graphs off > $OUT/ncu_b.csv 2> $OUT/ncu_b.err
tail -2 $OUT/ncu_b.err
timeout 120 ncu --clock-control none --kernel-name regex:k_attn_decode_mma_batch --launch-skip 40 --launch-count 1 --set full \
  out/dev/squeezekv bench --dummy $C --device cuda -b 64 -p 0 -d 512 -n 2 -r 1 --no-warmup --cuda-graphs off > $OUT/ncu_attn_b.txt 2>&1
grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers|Block Limit|Warp Cycles Per Issued|Stall|L1/TEX Hit|L2 Hit" $OUT/ncu_attn_b.txt | head -40
