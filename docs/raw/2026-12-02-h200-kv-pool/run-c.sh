#!/usr/bin/env bash
# Two changes (issue 26): a batch's mass kernel in blocks of 1024 keys (not one 64-key split a
# block), and the step issued layer by layer (Backend::submit: the host records layer l+1 while
# the device runs layer l; SQUEEZEKV_CUDA_LAYER_SUBMIT=0 is the step issued at its end, as
# before). cuda_test; the attention with and without mass alone; then the step, the two issue
# orders alternated twice, on the Llama-3.1-8B shape (bf16 dummy weights).
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 120 out/dev/cuda_test > $OUT/cuda_test_c.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|Expected|Which is" $OUT/cuda_test_c.txt | head -20
timeout 100 out/dev/squeezekv_bench_ops --device cuda --config bench/configs/llama-3.1-8b.json --depths 2048 --batch 128 --rounds 3 --filter "attn decode" 2>&1 | tee $OUT/ops_c.txt | grep "attn"
E="--dummy bench/configs/llama-3.1-8b.json -p 0 -r 3"
b() { echo "== $*"; timeout 150 env "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_c.txt; }
for round in 1 2; do
  for s in 1 0; do
    S="SQUEEZEKV_CUDA_LAYER_SUBMIT=$s out/dev/squeezekv bench --device cuda $E"
    b $S -n 64 -d 0 -b 1
    b $S -n 32 -d 512 -b 64
    b $S -n 16 -d 2048 --ctx 2112 -b 128
    b $S -n 16 -d 4096 --ctx 4160 -b 128 --kv-policy squeeze --kv-budget 2048
  done
done
