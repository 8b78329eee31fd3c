#!/usr/bin/env bash
# 2026-12-01, commit a2dbf97: where an evicting prompt's time goes on the GPU (8B shape, pp4096, budget 1024):
# policies without and with attention mass, and prefill chunk sizes.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
b() { echo "== $*"; timeout 120 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 4096 -n 4 -d 0 -r 3 "$@" 2>&1 | grep -E "^\| pp|error" | tee -a $OUT/bench_b.txt; }
for c in 512 4096; do b --prefill-chunk $c; done
for p in window h2o snapkv; do for c in 512 1024 2048; do b --kv-policy $p --kv-budget 1024 --prefill-chunk $c; done; done
