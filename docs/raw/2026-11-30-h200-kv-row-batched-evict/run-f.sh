#!/usr/bin/env bash
# 2026-11-30, commit 3d240b4 run 6: build s (= r + the decode split merge and the policies' mass in one kernel,
# k_attn_merge_mass): cuda_test (new: merge+mass == merge then mass to the bit; the KV row written
# by the attention == by its own kernel); A/B r vs s alternated: squeeze 2048 at 8192, h2o; then
# squeeze 2048 at 32768.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
B=out/dev/squeezekv
C=bench/configs/llama-3.1-8b.json
t0=$(date +%s)
lib() { echo $PWD/out/dev/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64; }
echo "== cuda_test s"; LD_LIBRARY_PATH=$(lib s) timeout 200 out/dev/cuda_test > $OUT/cuda_test_s.txt 2>&1; rc=$?; echo "rc $rc ($(( $(date +%s) - t0 )) s)"
grep -E "FAILED|PASSED|Expected|actual|graph replays|decode attention" $OUT/cuda_test_s.txt | head -12
[ $rc -ne 0 ] && exit 1
for round in 1 2; do
  for v in r s; do echo "== round $round squeeze 2048 @ 8192 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 8192 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | grep -E "^\| tg"; done
done
for v in r s; do echo "== h2o 2048 @ 8192 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 8192 -r 2 --kv-policy h2o --kv-budget 2048 2>&1 | grep -E "^\| tg"; done
echo "== squeeze 2048 @ 32768 s"; LD_LIBRARY_PATH=$(lib s) timeout 120 $B bench --device cuda --dummy $C -p 512 -n 64 -d 32768 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | grep -E "^\| tg|peak"
echo "($(( $(date +%s) - t0 )) s)"
