#!/usr/bin/env bash
# Decode attention on the tensor cores (attn_decode_mma.cu: a warp a block, mma.sync for S = Q K^T
# and O += P V) against the CUDA-core kernel (SQUEEZEKV_CUDA_MMA_DECODE=0), both in this build
# (out/dev); out/old: commit d579569. cuda_test, squeezekv_bench_ops (attention of one sequence
# and of batches), then `squeezekv bench` (Llama-3.1-8B shape, bf16 dummy weights), alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
NEWLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64 OLDLIB=$PWD/out/old/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; LD_LIBRARY_PATH=$NEWLIB timeout 150 out/dev/cuda_test > $OUT/cuda_test_c.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|differ from|Expected|Which is|replayed" $OUT/cuda_test_c.txt | head -40
for m in 1 0; do echo "== ops mma_decode=$m"; LD_LIBRARY_PATH=$NEWLIB SQUEEZEKV_CUDA_MMA_DECODE=$m timeout 100 out/dev/squeezekv_bench_ops --device cuda --config bench/configs/llama-3.1-8b.json --depths 512,4096,32768 --batch 8,64 --rounds 3 --filter "attn decode"; done 2>&1 | grep -v "^|---\|^| op\|^# copy" | tee $OUT/bench_ops_c.txt
b() { echo "== $1 $2 $3"; LD_LIBRARY_PATH=$([ $1 = new ] && echo $NEWLIB || echo $OLDLIB) env $2 timeout 120 out/$([ $1 = new ] && echo dev || echo old)/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json $3 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_batch_c.txt; }
b new X=1 "-p 0 -n 32 -d 512 -r 3 -b 1,8,64,256"
b new SQUEEZEKV_CUDA_MMA_DECODE=0 "-p 0 -n 32 -d 512 -r 3 -b 8,64,256"
b new X=1 "-p 0 -n 16 -d 4096 -r 3 -b 64"
b new SQUEEZEKV_CUDA_MMA_DECODE=0 "-p 0 -n 16 -d 4096 -r 3 -b 64"
b old X=1 "-p 0 -n 16 -d 4096 -r 3 -b 64"
b new X=1 "-p 0 -n 16 -d 4096 -r 3 -b 64 --kv-policy squeeze --kv-budget 1024"
b new X=1 "-p 512 -n 64 -d 0,32768 -r 3"
b new SQUEEZEKV_CUDA_MMA_DECODE=0 "-p 0 -n 64 -d 0,32768 -r 3"
