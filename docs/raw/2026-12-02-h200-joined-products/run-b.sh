#!/usr/bin/env bash
# Issue 26 figures beside llama.cpp in one call, on the machine run-a.sh left warm (its llama.cpp
# build and GGUF in out/peer), with the joined products: both engines fill B sequences with one
# prompt and copies, then time the decode steps; the engines alternate (as run-d2.sh of
# 2026-12-02-h200-kv-pool).
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
DEVLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64 PEERLIB=$PWD/out/peer/build/bin:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
[ -f out/peer/l8b.gguf ] && [ -x out/peer/build/bin/llama-batched-bench ] || { echo "run-a.sh's outputs are gone (a fresh machine)"; exit 1; }
lb() { echo "== llama.cpp $*"; LD_LIBRARY_PATH=$PEERLIB timeout 200 out/peer/build/bin/llama-batched-bench -m out/peer/l8b.gguf -ngl 99 -fa on -pps "$@" 2>&1 | grep -E "^\|  *[0-9]|error|failed" | tee -a $OUT/llama_batched.txt; }
sb() { echo "== squeezekv $*"; LD_LIBRARY_PATH=$DEVLIB timeout 200 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 0 "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/squeezekv_bench.txt; }
echo "== llama-bench"; LD_LIBRARY_PATH=$PEERLIB timeout 120 out/peer/build/bin/llama-bench -m out/peer/l8b.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>&1 | grep -E "^\||error" | tee $OUT/llama_bench.txt
LD_LIBRARY_PATH=$DEVLIB timeout 120 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 512 -n 128 -r 3 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/squeezekv_bench.txt
lb -c 139264 -npp 512 -ntg 32 -npl 1,8,16,32,64,128,256
sb -n 32 -d 512 -r 3 -b 1,8,16,32,64,128,256
lb -c 264192 -npp 4096 -ntg 32 -npl 64
sb -n 32 -d 4096 -r 3 -b 64
sb -n 32 -d 4096 -r 3 -b 64 --kv-policy squeeze --kv-budget 1024
lb -c 786816 -npp 32768 -ntg 16 -npl 24
sb -n 16 -d 32768 --ctx 32800 -r 3 -b 24
sb -n 16 -d 32768 --ctx 32832 -r 3 -b 128 --kv-policy squeeze --kv-budget 2048
rm -f out/peer/l8b.gguf
echo "== serve"
LD_LIBRARY_PATH=$DEVLIB timeout 100 python3 bench/bench_server.py --bin out/dev/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 16,64 \
  --tokens 64 --rounds 1 --prompt-tokens 1024 -t 4 --json $OUT/serve.json -- --device cuda --ctx 2048 \
  --kv-policy squeeze --kv-budget 512 2>&1 | tail -5 | tee $OUT/serve.txt
