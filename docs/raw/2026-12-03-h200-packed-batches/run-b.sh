#!/usr/bin/env bash
# Second call: gemm_rows_q with 128 weight rows a block (the faster shape in run-a.sh) checked by
# cuda_test's packed-weight tests, then beside the dequantization to bf16 and cuBLAS it replaces
# (SQUEEZEKV_CUDA_QMMA=0) at B = 32, 64, 128 for Q4_K_M and 64, 128 for Q8_0, alternating.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
cfg=bench/configs/llama-3.1-8b.json
SQUEEZEKV_CUDA_QOUT=128 timeout 100 out/dev/cuda_test --gtest_filter='*Packed*:*Native*' 2>&1 | grep -E "OK \]|FAILED|Failure|PASSED|packed weights|native:" | tee $OUT/cuda_test.txt
sb() { echo "== squeezekv $*"; timeout 100 out/dev/squeezekv bench --device cuda --dummy $cfg -p 0 -n 32 -d 512 -r 3 "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/squeezekv_bench.txt; }
for round in 1 2; do
  SQUEEZEKV_CUDA_QMMA=0 sb --dummy-type Q4_K_M -b 32,64,128
  SQUEEZEKV_CUDA_QOUT=128 sb --dummy-type Q4_K_M -b 32,64,128
done
SQUEEZEKV_CUDA_QMMA=0 sb --dummy-type Q8_0 -b 64,128
SQUEEZEKV_CUDA_QOUT=128 sb --dummy-type Q8_0 -b 64,128
