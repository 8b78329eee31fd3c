#!/usr/bin/env bash
# 2026-11-30, commit 3d240b4 run 7: the run's final build t (commit 153da01: r's library + the new cuda_test
# check): cuda_test; the table: prompt 512 and decode at depth 0, full cache at 32768,
# squeeze 2048 at 32768 (twice), Qwen2.5-7B shape depth 0.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/t/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64
B=out/dev/squeezekv
C=bench/configs/llama-3.1-8b.json
t0=$(date +%s)
echo "== cuda_test t"; timeout 200 out/dev/cuda_test > $OUT/cuda_test_t.txt 2>&1; rc=$?; echo "rc $rc ($(( $(date +%s) - t0 )) s)"
grep -E "FAILED|PASSED|graph replays|decode attention|survivor" $OUT/cuda_test_t.txt | head -14
[ $rc -ne 0 ] && exit 1
echo "== d0 + pp512"; timeout 90 $B bench --device cuda --dummy $C -p 512 -n 128 -d 0 -r 3 2>&1 | tee $OUT/d0.txt | grep -E "^\| (tg|pp)|roofline|copy"
echo "== full 32768"; timeout 120 $B bench --device cuda --dummy $C -p 512 -n 64 -d 32768 -r 2 2>&1 | tee $OUT/full32k.txt | grep -E "^\| tg"
for i in 1 2; do echo "== squeeze 2048 @ 32768 ($i)"; timeout 150 $B bench --device cuda --dummy $C -p 512 -n 64 -d 32768 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | tee $OUT/sq32k_$i.txt | grep -E "^\| tg|peak"; done
echo "== qwen d0"; timeout 60 $B bench --device cuda --dummy bench/configs/qwen2.5-7b.json -p 512 -n 128 -d 0 -r 2 2>&1 | tee $OUT/qwen_d0.txt | grep -E "^\| (tg|pp)"
echo "($(( $(date +%s) - t0 )) s)"
