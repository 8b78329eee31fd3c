#!/usr/bin/env bash
# A decode batch's KV writes and attention in one launch for all its sequences (k_attn_decode_batch)
# against one sequence after another (SQUEEZEKV_CUDA_BATCH_ATTN=0): cuda_test (its new
# DecodeBatchIsBatchInvariant), then `squeezekv bench -b` (Llama-3.1-8B shape, bf16, full cache,
# depth 512), the GEMV and the tensor-core products, alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 300 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|differ from|Expected|Which is" $OUT/cuda_test.txt | head -30
b() { echo "== batch_attn=$1 batch_mma=$2 $3"; SQUEEZEKV_CUDA_BATCH_ATTN=$1 SQUEEZEKV_CUDA_BATCH_MMA=$2 timeout 200 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json $3 2>&1 | grep -E "^\| (pp|tg)|error" | tee -a $OUT/bench_batch.txt; }
b 1 1 "-p 0 -n 32 -d 512 -r 2 -b 1,8,64,128,256"
b 0 1 "-p 0 -n 32 -d 512 -r 2 -b 8,64"
b 1 0 "-p 0 -n 32 -d 512 -r 2 -b 8,64"
b 1 1 "-p 0 -n 32 -d 512 -r 2 -b 8,64"
