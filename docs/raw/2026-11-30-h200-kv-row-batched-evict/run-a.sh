#!/usr/bin/env bash
# 2026-11-30, commit 3d240b4 run 1: builds h (2026-11-30, commit 3484a41 final), m (= h + the decode attention writing the step's KV
# row), n (= m + the layers' evictions in one launch). cuda_test on n and m; A/B alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
B=out/dev/squeezekv
C=bench/configs/llama-3.1-8b.json
t0=$(date +%s)
lib() { echo $PWD/out/dev/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/gpu.txt 2>&1
for v in n m; do
  echo "== cuda_test $v"; LD_LIBRARY_PATH=$(lib $v) timeout 150 out/dev/cuda_test > $OUT/cuda_test_$v.txt 2>&1; rc=$?; echo "rc $rc ($(( $(date +%s) - t0 )) s)"
  grep -E "FAILED|PASSED|Expected|actual" $OUT/cuda_test_$v.txt | head -8
  [ $rc -ne 0 ] && exit 1
done
for round in 1 2; do
  for v in h m n; do echo "== round $round d0 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 60 $B bench --device cuda --dummy $C -p 512 -n 128 -d 0 -r 3 2>&1 | grep -E "^\| tg" | tee -a $OUT/d0_$v.txt; done
  for v in h n; do echo "== round $round squeeze 2048 @ 8192 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 8192 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | grep -E "^\| tg" | tee -a $OUT/sq8k_$v.txt; done
  echo "($(( $(date +%s) - t0 )) s)"
done
for v in h n; do echo "== full 32768 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 32768 -r 1 2>&1 | grep -E "^\| tg" | tee -a $OUT/full32k_$v.txt; done
echo "== squeeze 2048 @ 32768 n"; LD_LIBRARY_PATH=$(lib n) timeout 120 $B bench --device cuda --dummy $C -p 512 -n 64 -d 32768 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | tee $OUT/sq32k_n_full.txt | grep -E "^\| tg|peak"
echo "($(( $(date +%s) - t0 )) s)"
