#!/usr/bin/env bash
# Batches of at most 16 rows in blocks of 16 weight rows (twice the blocks): cuda_test (its batches
# of 5 and 8 rows now run in another block shape than the batch of 130 they are compared with),
# then bench -b with and without SQUEEZEKV_CUDA_BATCH_MMA=1, alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 240 out/dev/cuda_test > $OUT/cuda_test_d.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|batched" $OUT/cuda_test_d.txt | head -20
b() { echo "== batch_mma=$1 $2"; SQUEEZEKV_CUDA_BATCH_MMA=$1 timeout 280 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json $2 2>&1 | grep -E "^\| (pp|tg)|error" | tee -a $OUT/bench_batch_d.txt; }
for round in 1 2; do
  b 1 "-p 0 -n 32 -d 512 -r 2 -b 8,16,32,64"
  b 0 "-p 0 -n 32 -d 512 -r 2 -b 8,16"
done
