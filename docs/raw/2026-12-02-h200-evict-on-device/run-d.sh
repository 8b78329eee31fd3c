#!/usr/bin/env bash
# Sampling a decode batch at once on the host's threads, and sampling without sorting the whole
# vocabulary: serve --device cuda, short prompts, 16 and 64 streams, greedy and sampled
# (temperature 0.8, top_p 0.95, the server's top_k 40 default), this build (out/dev) and the one
# before (out/prev: commit of Scheduler::times), alternated.
set -u
serve() {  # build, label, bench_server flags..., -- serve flags
  local build=$1 label=$2; shift 2
  echo "== $build $label" | tee -a $OUT/serve_d.txt
  LD_LIBRARY_PATH=$PWD/out/$build/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 170 python3 bench/bench_server.py \
    --bin out/$build/squeezekv --dummy bench/configs/llama-3.1-8b.json "$@" 2>&1 | tail -6 | tee -a $OUT/serve_d.txt
}
for build in dev prev; do
  serve $build "greedy, squeeze 512" --streams 16,64 --tokens 128 --rounds 2 -t 4 -- --device cuda --ctx 2048 --kv-policy squeeze --kv-budget 512
  serve $build "sampled, squeeze 512" --streams 16,64 --tokens 128 --rounds 2 -t 4 --temperature 0.8 --top-p 0.95 -- --device cuda --ctx 2048 --kv-policy squeeze --kv-budget 512
done
