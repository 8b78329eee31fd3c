#!/usr/bin/env bash
# 2026-11-30, commit 3d240b4 run 8: build u (= t + a decode step's mass deferred to the layer's eviction kernel;
# SQUEEZEKV_CUDA_DEFER_MASS=0 turns it off in the same build): cuda_test (new:
# DeferredMassEqualsTheMassKernel); A/B off vs on alternated: squeeze 2048 at 8192, h2o 2048 at
# 8192; squeeze 2048 at 32768 (on, twice); depth 0 (on) as a control.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/u/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64
B=out/dev/squeezekv
C=bench/configs/llama-3.1-8b.json
t0=$(date +%s)
echo "== cuda_test u"; timeout 200 out/dev/cuda_test > $OUT/cuda_test_u.txt 2>&1; rc=$?; echo "rc $rc ($(( $(date +%s) - t0 )) s)"
grep -E "FAILED|PASSED|Failure|Deferred|graph replays|survivor" $OUT/cuda_test_u.txt | head -20
[ $rc -ne 0 ] && exit 1
for round in 1 2; do
  for d in 0 1; do echo "== round $round squeeze 2048 @ 8192 defer=$d"; SQUEEZEKV_CUDA_DEFER_MASS=$d timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 8192 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | grep -E "^\| tg"; done
done
for d in 0 1; do echo "== h2o 2048 @ 8192 defer=$d"; SQUEEZEKV_CUDA_DEFER_MASS=$d timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 8192 -r 2 --kv-policy h2o --kv-budget 2048 2>&1 | grep -E "^\| tg"; done
for i in 1 2; do echo "== squeeze 2048 @ 32768 ($i)"; timeout 150 $B bench --device cuda --dummy $C -p 512 -n 64 -d 32768 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | grep -E "^\| tg|peak"; done
echo "== d0"; timeout 60 $B bench --device cuda --dummy $C -p 512 -n 128 -d 0 -r 3 2>&1 | grep -E "^\| tg"
echo "($(( $(date +%s) - t0 )) s)"
