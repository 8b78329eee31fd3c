#!/usr/bin/env bash
# Decode batches on the tensor cores (gemm_rows.cu, SQUEEZEKV_CUDA_BATCH_MMA=1) against the 4-row
# GEMV launches (the default): cuda_test, then `squeezekv bench -b` (Llama-3.1-8B shape, bf16,
# full cache, depth 512) with each, alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 240 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|survivor|tensor cores|batched" $OUT/cuda_test.txt | head -20
b() { echo "== batch_mma=$1 $2"; SQUEEZEKV_CUDA_BATCH_MMA=$1 timeout 280 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json $2 2>&1 | grep -E "^\| (pp|tg)|error|device" | tee -a $OUT/bench_batch.txt; }
b 1 "-p 0 -n 32 -d 512 -r 2 -b 1,8,32,64,128,256"
b 0 "-p 0 -n 32 -d 512 -r 2 -b 1,8,32,64"
b 1 "-p 0 -n 32 -d 512 -r 2 -b 1,8,32,64"
