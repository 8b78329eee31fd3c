#!/usr/bin/env bash
# The batched tensor-core products with the columns in slices per thread-block cluster
# (gemm_rows_slices): cuda_test, the decode products at 1, 8, 64 and 256 rows
# (squeezekv_bench_ops, SQUEEZEKV_CUDA_BATCH_MMA=1), then the whole step (squeezekv bench -b).
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 300 out/dev/cuda_test > $OUT/cuda_test_c.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|differ from|tensor cores|Expected|Which is" $OUT/cuda_test_c.txt | head -30
SQUEEZEKV_CUDA_BATCH_MMA=1 timeout 200 out/dev/squeezekv_bench_ops --device cuda --config bench/configs/llama-3.1-8b.json --depths 512 --batch 1,8,16,64,256 --rounds 3 --filter gemv 2>&1 | tee $OUT/bench_ops_c.txt
b() { echo "== batch_mma=$1"; SQUEEZEKV_CUDA_BATCH_MMA=$1 timeout 200 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 0 -n 32 -d 512 -r 2 -b $2 2>&1 | grep -E "^\| (pp|tg)|error" | tee -a $OUT/bench_batch_c.txt; }
b 1 1,8,16,64,256; b 0 8,16,64; b 1 8,16,64
