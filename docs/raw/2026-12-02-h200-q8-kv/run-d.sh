#!/usr/bin/env bash
# Q8_0 KV beside llama.cpp's (issue 27), on the machine run-a.sh left warm (its llama.cpp build in
# out/peer): the Llama-3.1-8B shape with random bf16 weights, its GGUF written here by
# bench/make_dummy_gguf.py; one sequence decoding at depth 32768 and 64 sequences at 4096, f16 and
# q8_0 K and V in both engines (llama.cpp: -fa 1 -ctk T -ctv T), the engines alternated.
set -u
DEVLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64 PEERLIB=$PWD/out/peer/build/bin:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
[ -x out/peer/build/bin/llama-bench ] || { echo "run-a.sh's llama.cpp build is gone (a fresh machine)"; exit 1; }
t0=$(date +%s); PYTHONPATH=$PWD/out/peer/gguf-py timeout 200 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json out/peer/l8b.gguf > /dev/null 2>&1
echo "gguf rc $? in $(( $(date +%s) - t0 )) s"; ls -la out/peer/l8b.gguf
E="--dummy bench/configs/llama-3.1-8b.json"
sb() { echo "== squeezekv $*"; LD_LIBRARY_PATH=$DEVLIB timeout 150 out/dev/squeezekv bench --device cuda $E -p 0 "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/squeezekv_bench.txt; }
lb() { echo "== llama-bench $*"; LD_LIBRARY_PATH=$PEERLIB timeout 150 out/peer/build/bin/llama-bench -m out/peer/l8b.gguf -ngl 99 -fa 1 -p 0 "$@" 2>&1 | grep -E "^\||error" | tee -a $OUT/llama_bench.txt; }
lbb() { echo "== llama-batched-bench $*"; LD_LIBRARY_PATH=$PEERLIB timeout 150 out/peer/build/bin/llama-batched-bench -m out/peer/l8b.gguf -ngl 99 -fa on -pps "$@" 2>&1 | grep -E "^\|  *[0-9]|error|failed" | tee -a $OUT/llama_batched.txt; }
for round in 1 2; do
  for t in f16 q8_0; do
    sb -n 32 -d 32768 --ctx 32800 -r 3 --kv-type $t
    lb -n 32 -d 32768 -r 3 -ctk $t -ctv $t
  done
done
for t in f16 q8_0; do
  sb -n 32 -d 4096 -r 3 -b 64 --kv-type $t
  lbb -c 264192 -npp 4096 -ntg 32 -npl 64 -ctk $t -ctv $t
done
rm -f out/peer/l8b.gguf
