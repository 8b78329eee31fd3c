#!/usr/bin/env bash
# The evicting prompt of the final build (out/dev) against the one-file build of commit a2dbf97
# (out/dev0), more repetitions, alternated three times: h2o (mass + compaction), window
# (compaction only) and the full cache.
set -u
b() { echo "== $1 $2"; LD_LIBRARY_PATH=$PWD/out/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 150 out/$1/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 4096 -n 0 -d 0 -r 7 $2 2>&1 | grep -E "^\| (pp|tg)|error" | tee -a $OUT/bench_prompt.txt; }
for round in 1 2 3; do
  for build in dev dev0; do
    b $build "--kv-policy h2o --kv-budget 1024"
    b $build "--kv-policy window --kv-budget 1024"
  done
done
for build in dev dev0; do b $build "--kv-policy full"; done
