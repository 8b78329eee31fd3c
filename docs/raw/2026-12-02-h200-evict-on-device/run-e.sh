#!/usr/bin/env bash
# Top-p without sorting the vocabulary (commit of the sampler's histogram): serve --device cuda,
# short prompts, sampled (temperature 0.8, top_p 0.95; the API's default: no top-k) and greedy,
# squeeze 512, 16 and 64 streams.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
for t in "--temperature 0.8 --top-p 0.95" "--temperature 0"; do
  echo "== $t" | tee -a $OUT/serve_e.txt
  timeout 200 python3 bench/bench_server.py --bin out/dev/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 16,64 \
    --tokens 128 --rounds 2 -t 4 $t -- --device cuda --ctx 2048 --kv-policy squeeze --kv-budget 512 2>&1 | tail -6 | tee -a $OUT/serve_e.txt
done
