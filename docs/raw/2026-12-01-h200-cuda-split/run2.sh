#!/usr/bin/env bash
# The final build of 2026-12-01 (issue 25: the split CUDA backend plus the runtime's one observer
# hook, the step checks in the runner and the CachePlan; out/dev) against the one-file build of
# commit a2dbf97 (out/dev0): cuda_test, every op alone (squeezekv_bench_ops on each library), then
# the end-to-end bench, the two builds alternated twice.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== cuda_test (final)"; LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 200 out/dev/cuda_test > $OUT/cuda_test_final.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|survivor|tensor cores" $OUT/cuda_test_final.txt | head -20
ops() { echo "== ops $1 round $2"; LD_LIBRARY_PATH=$PWD/out/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 150 out/dev/squeezekv_bench_ops --device cuda --config bench/configs/llama-3.1-8b.json --depths 512,4096,32768 --rounds 5 > $OUT/ops_final_$1_$2.txt 2>&1; echo "rc $?"; }
ops dev 1; ops dev0 1; ops dev 2; ops dev0 2
b() { echo "== $1 $2"; LD_LIBRARY_PATH=$PWD/out/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 150 out/$1/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json $2 2>&1 | grep -E "^\| (pp|tg)|error" | tee -a $OUT/bench_final.txt; }
for round in 1 2; do
  for build in dev dev0; do
    b $build "-p 512 -n 128 -d 0 -r 3"
    b $build "-p 0 -n 64 -d 32768 -r 2"
    b $build "-p 0 -n 64 -d 32768 -r 2 --kv-policy squeeze --kv-budget 2048"
    b $build "-p 4096 -n 4 -d 0 -r 3 --kv-policy h2o --kv-budget 1024"
  done
done
