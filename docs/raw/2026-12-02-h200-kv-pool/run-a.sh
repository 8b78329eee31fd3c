#!/usr/bin/env bash
# Issue 26, the KV pool and sequence copies (commit 6cdc059): cuda_test (every test, the copy and
# block-cache tests among them), then `squeezekv bench -b` on the Llama-3.1-8B shape (bf16 dummy
# weights; B sequences filled by one prefill and copies): depth 512 and 4096, and depth 32768 with
# squeeze 2048 x 128 sequences and the full cache at as many as the default pool holds; then
# `serve --device cuda` under bench_server.py (64 streams, squeeze) with /metrics read after it.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
echo "== cuda_test"; timeout 240 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|differ|Expected|Which is|replayed" $OUT/cuda_test.txt | head -30
B="out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json"
b() { echo "== $*"; timeout 200 $B "$@" 2>&1 | grep -E "^\| (pp|tg)|rror|^copy" | tee -a $OUT/bench.txt; }
b -p 0 -n 32 -d 512 -r 3 -b 1,64,128,256
b -p 0 -n 16 -d 4096 -r 3 -b 64
b -p 0 -n 16 -d 4096 -r 3 -b 64,128 --kv-policy squeeze --kv-budget 1024
b -p 0 -n 16 -d 32768 --ctx 32832 -r 3 -b 64,128 --kv-policy squeeze --kv-budget 2048
b -p 0 -n 8 -d 32768 --ctx 32800 -r 2 -b 8,16,24
echo "== serve"
timeout 150 python3 bench/bench_server.py --bin out/dev/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 1,16,64 \
  --tokens 64 --rounds 2 --prompt-tokens 1024 -t 4 --json $OUT/serve.json -- --device cuda --ctx 2048 \
  --kv-policy squeeze --kv-budget 512 2>&1 | tail -12 | tee $OUT/serve.txt
