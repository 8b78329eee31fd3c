#!/usr/bin/env bash
# 2026-12-01, commit a2dbf97: cuda_test on the build whose eviction_error cut is scaled to the input seen; squeeze's
# prompt time (8B shape) with that cut against h2o and the full cache.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== cuda_test"; timeout 200 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|survivor|OK \]" $OUT/cuda_test.txt | head -30
for p in squeeze h2o full; do
  echo "== $p"
  timeout 120 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 4096 -n 32 -d 0 -r 3 --kv-policy $p --kv-budget 1024 2>&1 | grep -E "^\| (pp|tg)|error" | tee -a $OUT/bench.txt
done
