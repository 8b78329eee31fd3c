#!/usr/bin/env bash
# 2026-11-30, commit 3d240b4 run 10: build v (= u + a deferred mass dropped when its memory is freed, and the
# layer's score buffers with it): cuda_test; squeeze 2048 at 8192 once.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/v/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test v"; timeout 100 out/dev/cuda_test > $OUT/cuda_test_v.txt 2>&1; rc=$?; echo "rc $rc"
grep -E "FAILED|PASSED|Failure|Deferred" $OUT/cuda_test_v.txt | head -12
[ $rc -ne 0 ] && exit 1
timeout 60 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 512 -n 64 -d 8192 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | grep -E "^\| tg"
