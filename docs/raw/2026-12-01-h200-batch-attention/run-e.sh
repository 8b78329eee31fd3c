#!/usr/bin/env bash
# The default decode batch after this change (cuBLAS products past 4 rows, batched attention):
# cuda_test (DecodeBatchIsBatchInvariant with --batch-invariant on, DecodeBatchWithinItsTolerance
# by default), then `squeezekv bench -b` (Llama-3.1-8B shape, bf16): the default, --batch-invariant
# on, and gemm_rows (SQUEEZEKV_CUDA_BATCH=mma) at depth 512; depth 4096 full and squeeze 1024;
# one sequence at depth 0.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 300 out/dev/cuda_test > $OUT/cuda_test_e.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|differ from|Expected|Which is" $OUT/cuda_test_e.txt | head -30
b() { echo "== $1 $2"; env $1 timeout 200 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json $2 2>&1 | grep -E "^\| (pp|tg)|error" | tee -a $OUT/bench_batch_e.txt; }
b X=1 "-p 0 -n 32 -d 512 -r 3 -b 1,8,16,32,64,128,256"
b X=1 "-p 0 -n 32 -d 512 -r 2 -b 8,64 --batch-invariant on"
b SQUEEZEKV_CUDA_BATCH=mma "-p 0 -n 32 -d 512 -r 2 -b 8,64"
b X=1 "-p 0 -n 32 -d 512 -r 3 -b 8,64"
b X=1 "-p 0 -n 16 -d 4096 -r 2 -b 64"
b X=1 "-p 0 -n 16 -d 4096 -r 2 -b 64 --kv-policy squeeze --kv-budget 1024"
b X=1 "-p 0 -n 64 -d 0 -r 3"
