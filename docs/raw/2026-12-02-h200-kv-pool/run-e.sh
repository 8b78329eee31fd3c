#!/usr/bin/env bash
# `serve --device cuda` where the decode dominates (short prompts, 128 tokens each), 16 and 64
# streams, squeeze 512 and the full cache, then /metrics of a server left idle (the pool).
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
for kv in "--kv-policy squeeze --kv-budget 512" ""; do
  echo "== serve $kv"
  timeout 150 python3 bench/bench_server.py --bin out/dev/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 16,64 \
    --tokens 128 --rounds 2 -t 4 -- --device cuda --ctx 2048 $kv 2>&1 | tail -5 | tee -a $OUT/serve_e.txt
done
out/dev/squeezekv serve --dummy bench/configs/llama-3.1-8b.json --device cuda --port 18181 --parallel 64 > $OUT/serve_e_log.txt 2>&1 &
for i in $(seq 60); do curl -s localhost:18181/health > /dev/null && break; sleep 1; done
curl -s localhost:18181/metrics | grep kv_pool | tee $OUT/metrics_e.txt
kill %1; wait
