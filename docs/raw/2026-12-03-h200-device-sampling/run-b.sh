#!/usr/bin/env bash
# Second call, the same two builds as run-a.sh: greedy at 64 streams alternated twice in both
# orders (run-a's one greedy pair disagreed with every earlier greedy figure), and sampled
# (temperature 0.8, top_p 0.95) at 16 streams.
set -u
serve() {  # build, label, streams, bench_server flags...
  local build=$1 label=$2 streams=$3; shift 3
  echo "== $build $label $streams" | tee -a $OUT/serve_b.txt
  LD_LIBRARY_PATH=$PWD/out/$build/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 120 python3 bench/bench_server.py \
    --bin out/$build/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams $streams --tokens 128 --rounds 2 -t 4 \
    --client raw "$@" -- --device cuda --ctx 2048 --kv-policy squeeze --kv-budget 512 2>&1 | tail -4 | tee -a $OUT/serve_b.txt
}
serve dev greedy 64 --temperature 0
serve base greedy 64 --temperature 0
serve base greedy 64 --temperature 0
serve dev greedy 64 --temperature 0
serve base "top_p 0.95" 16 --temperature 0.8 --top-p 0.95
serve dev "top_p 0.95" 16 --temperature 0.8 --top-p 0.95
