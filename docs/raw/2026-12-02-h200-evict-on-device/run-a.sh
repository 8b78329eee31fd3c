#!/usr/bin/env bash
# Eviction of any number of rows where the mass lives (Backend::kv_evict_top) and eviction_error's
# cut chosen and summed on the device: cuda_test; a 128-token prompt under the full cache, h2o 64
# and squeeze 64, and a 4096-token prompt under h2o 1024, this build (out/dev) and the one before
# (out/old, commit 3fa8111) alternated twice; serve --device cuda with short prompts, squeeze 512
# and the full cache, both builds.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 200 out/dev/cuda_test > $OUT/cuda_test_a.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|Expected|Which is|survivor" $OUT/cuda_test_a.txt | head -30
for round in 1 2; do
  for build in dev old; do
    E="env LD_LIBRARY_PATH=$PWD/out/$build/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 out/$build/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json"
    for kv in "" "--kv-policy h2o --kv-budget 64" "--kv-policy squeeze --kv-budget 64"; do
      echo "$build round $round p128 $kv: $($E -p 128 -n 0 -r 5 $kv 2>&1 | grep -E '^\| pp|rror')" | tee -a $OUT/bench_a.txt
    done
    echo "$build round $round p4096 h2o 1024: $($E -p 4096 -n 0 -r 3 --kv-policy h2o --kv-budget 1024 2>&1 | grep -E '^\| pp|rror')" | tee -a $OUT/bench_a.txt
    echo "$build round $round p4096 squeeze 1024: $($E -p 4096 -n 0 -r 3 --kv-policy squeeze --kv-budget 1024 2>&1 | grep -E '^\| pp|rror')" | tee -a $OUT/bench_a.txt
  done
done
for build in dev old; do
  for kv in "--kv-policy squeeze --kv-budget 512" ""; do
    [ "$build" = old ] && [ -z "$kv" ] && continue
    echo "== $build serve short prompts $kv" | tee -a $OUT/serve_a.txt
    LD_LIBRARY_PATH=$PWD/out/$build/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 150 python3 bench/bench_server.py \
      --bin out/$build/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 16,64 \
      --tokens 128 --rounds 2 -t 4 -- --device cuda --ctx 2048 $kv 2>&1 | tail -5 | tee -a $OUT/serve_a.txt
  done
done
