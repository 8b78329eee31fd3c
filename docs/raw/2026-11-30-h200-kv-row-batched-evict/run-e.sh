#!/usr/bin/env bash
# 2026-11-30, commit 3d240b4 run 5: build r (= n + 8 warps a decode attention block where a split holds <= 64 keys
# and a kv head <= 4 query heads; 4 otherwise): cuda_test; A/B n vs r alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
B=out/dev/squeezekv
C=bench/configs/llama-3.1-8b.json
t0=$(date +%s)
lib() { echo $PWD/out/dev/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64; }
echo "== cuda_test r"; LD_LIBRARY_PATH=$(lib r) timeout 150 out/dev/cuda_test > $OUT/cuda_test_r.txt 2>&1; rc=$?; echo "rc $rc ($(( $(date +%s) - t0 )) s)"
grep -E "FAILED|PASSED|Expected|actual" $OUT/cuda_test_r.txt | head -8
[ $rc -ne 0 ] && exit 1
for round in 1 2; do
  for v in n r; do echo "== round $round squeeze 2048 @ 8192 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 8192 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | grep -E "^\| tg"; done
  for v in n r; do echo "== round $round d0 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 60 $B bench --device cuda --dummy $C -p 512 -n 128 -d 0 -r 3 2>&1 | grep -E "^\| tg"; done
done
for v in n r; do echo "== full 8192 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 8192 -r 2 2>&1 | grep -E "^\| tg"; done
for v in n r; do echo "== full 32768 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 32768 -r 1 2>&1 | grep -E "^\| tg"; done
for v in n r; do echo "== qwen d0 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 60 $B bench --device cuda --dummy bench/configs/qwen2.5-7b.json -p 512 -n 128 -d 0 -r 2 2>&1 | grep -E "^\| tg"; done
echo "== squeeze 2048 @ 32768 r"; LD_LIBRARY_PATH=$(lib r) timeout 120 $B bench --device cuda --dummy $C -p 512 -n 64 -d 32768 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | grep -E "^\| tg|peak"
echo "($(( $(date +%s) - t0 )) s)"
