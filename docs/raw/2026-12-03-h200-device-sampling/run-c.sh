#!/usr/bin/env bash
# Third call: `squeezekv bench` at 64 and 128 sequences, context 512, 8B shape (dummy bf16): the
# build before (decode(): every step's logits copied to the host, 33 MB at 64) and this one
# (decode_sampled with greedy settings: the tokens picked on the device, as the server does),
# alternated twice; then serve greedy at 64 streams alternated three times.
set -u
bench() {  # build
  echo "== $1 bench" | tee -a $OUT/bench_c.txt
  LD_LIBRARY_PATH=$PWD/out/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 120 out/$1/squeezekv bench --device cuda \
    --dummy bench/configs/llama-3.1-8b.json -p 0 -n 32 -d 512 -b 64,128 -r 3 2>&1 | grep -E "^\| tg|rror" | tee -a $OUT/bench_c.txt
}
serve() {  # build
  echo "== $1 greedy 64" | tee -a $OUT/serve_c.txt
  LD_LIBRARY_PATH=$PWD/out/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 120 python3 bench/bench_server.py \
    --bin out/$1/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 64 --tokens 128 --rounds 2 -t 4 \
    --client raw --temperature 0 -- --device cuda --ctx 2048 --kv-policy squeeze --kv-budget 512 2>&1 | tail -2 | tee -a $OUT/serve_c.txt
}
bench base; bench dev; bench dev; bench base
serve base; serve dev; serve dev; serve base; serve base; serve dev
