#!/usr/bin/env bash
# 2026-12-01, commit a2dbf97: the prompt chunk's mass on the tensor cores (k_attn_mma_mass): cuda_test, then the
# evicting prompts (8B shape, pp4096, budget 1024) with it and without (SQUEEZEKV_CUDA_MMA_MASS=0),
# alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 200 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|survivor|tensor cores|OK \]" $OUT/cuda_test.txt | head -30
b() { echo "== $*"; timeout 120 env "$@" out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 4096 -n 32 -d 0 -r 3 --kv-budget 1024 $POL 2>&1 | grep -E "^\| (pp|tg)|error" | tee -a $OUT/bench_c.txt; }
for POL in "--kv-policy h2o" "--kv-policy snapkv" "--kv-policy squeeze"; do
  for round in 1 2; do b SQUEEZEKV_CUDA_MMA_MASS=1; b SQUEEZEKV_CUDA_MMA_MASS=0; done
done
POL="--kv-policy full"; b X=1
