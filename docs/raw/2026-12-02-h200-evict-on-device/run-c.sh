#!/usr/bin/env bash
# Where serve --device cuda spends a step (commit of Scheduler::times, /metrics'
# squeezekv_engine_* counters, printed by bench_server.py): short prompts, squeeze 512 and the full
# cache, 16 and 64 streams; beside it the engine alone, 64 sequences at context 128 and 512.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
for kv in "--kv-policy squeeze --kv-budget 512" ""; do
  echo "== serve short prompts $kv" | tee -a $OUT/serve_c.txt
  timeout 170 python3 bench/bench_server.py --bin out/dev/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 16,64 \
    --tokens 128 --rounds 2 -t 4 -- --device cuda --ctx 2048 $kv 2>&1 | tail -6 | tee -a $OUT/serve_c.txt
done
E="out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -r 3"
for d in 128 512; do $E -p 0 -n 32 -d $d -b 16,64 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_c.txt; done
