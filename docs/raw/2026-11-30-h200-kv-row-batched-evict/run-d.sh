#!/usr/bin/env bash
# 2026-11-30, commit 3d240b4 run 4: build q (= n + 8 warps a decode attention block for up to 4 query heads a kv
# head): cuda_test; A/B n vs q alternated: squeeze 2048 at 8192, depth 0, full 32768, Qwen d0.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
B=out/dev/squeezekv
C=bench/configs/llama-3.1-8b.json
t0=$(date +%s)
lib() { echo $PWD/out/dev/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64; }
echo "== cuda_test q"; LD_LIBRARY_PATH=$(lib q) timeout 150 out/dev/cuda_test > $OUT/cuda_test_q.txt 2>&1; rc=$?; echo "rc $rc ($(( $(date +%s) - t0 )) s)"
grep -E "FAILED|PASSED|Expected|actual" $OUT/cuda_test_q.txt | head -8
[ $rc -ne 0 ] && exit 1
for round in 1 2; do
  for v in n q; do echo "== round $round squeeze 2048 @ 8192 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 8192 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | grep -E "^\| tg"; done
  for v in n q; do echo "== round $round d0 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 60 $B bench --device cuda --dummy $C -p 512 -n 128 -d 0 -r 3 2>&1 | grep -E "^\| tg"; done
done
for v in n q; do echo "== full 8192 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 8192 -r 2 2>&1 | grep -E "^\| tg"; done
for v in n q; do echo "== full 32768 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 32768 -r 1 2>&1 | grep -E "^\| tg"; done
for v in n q; do echo "== qwen d0 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 60 $B bench --device cuda --dummy bench/configs/qwen2.5-7b.json -p 512 -n 128 -d 0 -r 2 2>&1 | grep -E "^\| tg"; done
echo "($(( $(date +%s) - t0 )) s)"
