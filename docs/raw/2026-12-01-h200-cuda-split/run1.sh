#!/usr/bin/env bash
# The CUDA backend split into files by job (issue 25): cuda_test on the split build (out/dev), then
# every op alone (squeezekv_bench_ops, Llama-3.1-8B shapes) on the split library and on the one-file
# library of the commit before (out/dev0), alternated, then the end-to-end bench alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
echo "== cuda_test (split)"; LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 200 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|survivor|tensor cores" $OUT/cuda_test.txt | head -20
ops() { echo "== ops $1 round $2"; LD_LIBRARY_PATH=$PWD/out/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 150 out/dev/squeezekv_bench_ops --device cuda --config bench/configs/llama-3.1-8b.json --depths 512,4096,32768 --rounds 5 > $OUT/ops_$1_$2.txt 2>&1; echo "rc $?"; }
ops dev 1; ops dev0 1; ops dev 2; ops dev0 2
b() { echo "== $1 $POL"; LD_LIBRARY_PATH=$PWD/out/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 120 out/$1/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 512 -n 64 -d 0 -r 3 $POL 2>&1 | grep -E "^\| (pp|tg)|error" | tee -a $OUT/bench.txt; }
POL="--kv-policy full"; b dev; b dev0
