#!/usr/bin/env bash
# The splits' merge one warp a row (out/m: only that) and, beside it, the decode attention with
# two tile stages and 12 blocks an SM instead of three and 8 (out/v2): cuda_test on each, then
# the build before (out/dev, commit 55d5e05), m and v2 alternated twice (8B shape, bf16 dummy).
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
lib() { echo "$PWD/out/$1/lib:$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64"; }
C=bench/configs/llama-3.1-8b.json
for v in m v2; do
  echo "== cuda_test $v"
  LD_LIBRARY_PATH=$(lib $v) timeout 150 out/dev/cuda_test > $OUT/cuda_test_$v.txt 2>&1; echo "rc $?"
  grep -E "FAILED|PASSED|Failure" $OUT/cuda_test_$v.txt | head -10
done
for round in 1 2; do
  for v in dev m v2; do
    echo "== $v round $round" >> $OUT/bench_d.txt
    export LD_LIBRARY_PATH=$(lib $v)
    out/dev/squeezekv bench --dummy $C --device cuda -b 64,128 -p 0 -d 512 -n 64 -r 3 2>&1 | grep "^|" >> $OUT/bench_d.txt
    out/dev/squeezekv bench --dummy $C --device cuda -b 64 -p 0 -d 4096 -n 32 -r 3 2>&1 | grep "^|" >> $OUT/bench_d.txt
    out/dev/squeezekv bench --dummy $C --device cuda -p 0 -n 128 -r 3 2>&1 | grep "^|" >> $OUT/bench_d.txt
  done
done
grep -E "==|tg" $OUT/bench_d.txt
