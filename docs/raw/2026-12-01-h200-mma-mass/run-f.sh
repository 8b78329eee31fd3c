#!/usr/bin/env bash
# 2026-12-01, commit a2dbf97: k_attn_mma and k_attn_mma_mass on shared helpers (tile copies, the query fragments,
# the S product): cuda_test, then the prompt against the build before (out/dev0, ed037d9), alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
echo "== cuda_test"; LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 200 out/dev/cuda_test > $OUT/cuda_test_helpers.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|survivor|tensor cores" $OUT/cuda_test_helpers.txt | head -20
b() { echo "== $1 $POL"; LD_LIBRARY_PATH=$PWD/out/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 120 out/$1/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 4096 -n 4 -d 0 -r 3 $POL 2>&1 | grep -E "^\| pp|error" | tee -a $OUT/bench_f.txt; }
for POL in "--kv-policy full" "--kv-policy h2o --kv-budget 1024"; do
  for round in 1 2; do b dev; b dev0; done
done
