#!/usr/bin/env bash
# After the review: the batch path converts a decode step's activations to bf16 once for q, k, v
# (and gate, up) instead of once a matrix, and the tensor-core helpers live in mma.cuh: cuda_test,
# then bench -b with SQUEEZEKV_CUDA_BATCH_MMA=1.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 240 out/dev/cuda_test > $OUT/cuda_test_e.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|batched|tensor cores" $OUT/cuda_test_e.txt | head -20
SQUEEZEKV_CUDA_BATCH_MMA=1 timeout 280 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 0 -n 32 -d 512 -r 2 -b 1,8,64 2>&1 | grep -E "^\| (pp|tg)|error" | tee $OUT/bench_batch_e.txt
