#!/usr/bin/env bash
# Native weights, fourth call: the packed GEMV's warps a block (SQUEEZEKV_CUDA_QWARPS 1, 2, 4),
# alternated twice, one sequence's decode of the 8B shape in Q4_K_M, Q8_0, Q6_K; and the
# batch-invariance test at each.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
cfg=bench/configs/llama-3.1-8b.json
for w in 1 2 4; do
  SQUEEZEKV_CUDA_QWARPS=$w SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared timeout 100 out/dev/cuda_test \
    --gtest_filter='*Packed*:*NativeWeight*:*DecodeBatchIsBatchInvariant*' 2>&1 | grep -E "OK \]|FAILED|Failure" | sed "s/^/qwarps $w: /"
done
for round in 1 2; do
  for t in Q4_K_M Q8_0 Q6_K; do
    for w in 1 2 4; do
      echo "== $t qwarps $w"; SQUEEZEKV_CUDA_QWARPS=$w timeout 60 out/dev/squeezekv bench --device cuda --dummy $cfg --dummy-type $t -p 0 -n 128 -r 3 2>&1 | grep -E "^\| tg|error" | tee -a $OUT/qwarps.txt
    done
  done
done
