#!/usr/bin/env bash
# Q8_0 rows on the tensor cores (each tile converted to f16 in shared memory, then the f16
# kernel's mma): cuda_test, then f16 and q8_0 rows alternated on the Llama-3.1-8B shape (bf16
# dummy weights): one sequence at depth 32768, 64 sequences at 4096 (full, and squeeze 1024), and
# 128 sequences at 32768 under squeeze 2048.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
DEVLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
echo "== cuda_test"; LD_LIBRARY_PATH=$DEVLIB timeout 200 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|Expected|Which is|q8_0|head dim|decode attention" $OUT/cuda_test.txt | head -40
E="--dummy bench/configs/llama-3.1-8b.json"
b() { echo "== $*"; LD_LIBRARY_PATH=$DEVLIB timeout 150 "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench.txt; }
for round in 1 2; do
  for t in f16 q8_0; do
    b out/dev/squeezekv bench --device cuda $E -p 0 -n 32 -d 32768 --ctx 32800 -r 3 --kv-type $t
    b out/dev/squeezekv bench --device cuda $E -p 0 -n 32 -d 4096 -r 3 -b 64 --kv-type $t
    b out/dev/squeezekv bench --device cuda $E -p 0 -n 32 -d 4096 -r 3 -b 64 --kv-type $t --kv-policy squeeze --kv-budget 1024
  done
done
for t in f16 q8_0; do
  b out/dev/squeezekv bench --device cuda $E -p 0 -n 16 -d 32768 --ctx 32832 -r 3 -b 128 --kv-type $t --kv-policy squeeze --kv-budget 2048
done
