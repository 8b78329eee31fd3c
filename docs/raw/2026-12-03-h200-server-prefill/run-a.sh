#!/usr/bin/env bash
# Where a served batch's prompts spend their time: `squeezekv bench -b 64` times 64 prompts of 80
# tokens run as the server runs them (one chunk's worth of tokens a step) and 128 decode steps
# from depth 0, 8B shape (dummy bf16), under the policies and squeeze metrics that differ in
# prompt-time work; then one served run for the engine thread's own account.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/gpu.txt
bench() {  # label, flags...
  local label=$1; shift
  echo "== $label" | tee -a $OUT/bench_a.txt
  timeout 150 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json --ctx 2048 \
    -p 80 -n 128 -d 0 -b 64 -r 3 "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_a.txt
}
bench "squeeze 512 (eviction_error)" --kv-policy squeeze --kv-budget 512
bench "squeeze 512 attention_entropy" --kv-policy squeeze --kv-budget 512 --squeeze-metric attention_entropy
bench "h2o 512" --kv-policy h2o --kv-budget 512
bench "full" --kv-policy full
bench "squeeze 512 chunk 2048" --kv-policy squeeze --kv-budget 512 --prefill-chunk 2048
echo "== serve squeeze 512, 64 streams" | tee -a $OUT/serve_a.txt
timeout 120 python3 bench/bench_server.py --bin out/dev/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 64 \
  --tokens 128 --rounds 2 -t 4 --client raw --temperature 0 -- --device cuda --ctx 2048 --kv-policy squeeze \
  --kv-budget 512 2>&1 | tail -3 | tee -a $OUT/serve_a.txt
