#!/usr/bin/env bash
# The committed state (tensor-core decode attention, the CUDA cores' test held to f32 and the
# tensor cores' to their stated tolerance): cuda_test, then `squeezekv bench -b` (Llama-3.1-8B
# shape, bf16 dummy weights): depth 512 every batch size, depth 4096 full cache and squeeze 1024.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 150 out/dev/cuda_test > $OUT/cuda_test_d.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|differ from|Expected|Which is|decode attention" $OUT/cuda_test_d.txt | head -30
b() { echo "== $1"; timeout 150 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json $1 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_batch_d.txt; }
b "-p 0 -n 32 -d 512 -r 3 -b 1,8,16,32,64,128,256"
b "-p 0 -n 16 -d 4096 -r 3 -b 16,64,128"
b "-p 0 -n 16 -d 4096 -r 3 -b 64,128 --kv-policy squeeze --kv-budget 1024"
