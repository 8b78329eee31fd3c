#!/usr/bin/env bash
# 2026-12-01, commit 5e960bd run 1: build w (= the build of 2026-11-30, commit 3d240b4 v + the step's mass in one __device__ helper shared by
# k_attn_mass and the eviction kernel): cuda_test; squeeze 2048 at 8192, v and w alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
base=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test w"; LD_LIBRARY_PATH=$PWD/out/dev/w/lib:$base timeout 120 out/dev/cuda_test_w > $OUT/cuda_test_w.txt 2>&1; rc=$?; echo "rc $rc"
grep -E "FAILED|PASSED|Failure|Deferred|OK \]" $OUT/cuda_test_w.txt | head -16
[ $rc -ne 0 ] && exit 1
for r in 1 2; do for b in v w; do
  bin=out/dev/squeezekv; [ $b = w ] && bin=out/dev/squeezekv_w
  echo "== $b round $r"
  LD_LIBRARY_PATH=$PWD/out/dev/$b/lib:$base timeout 80 $bin bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 512 -n 64 -d 8192 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | grep -E "^\| tg"
done; done
