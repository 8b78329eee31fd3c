#!/usr/bin/env bash
# A decode batch's step after three changes (issue 26): the batch's attention blocks take several
# splits each (k_attn_decode_batch), small uploads go through pinned staging without waiting, and
# the cuBLAS products are recorded with the step's kernels (one CUDA graph); the products through
# cuBLASLt with each shape's fastest algorithm (SQUEEZEKV_CUDA_BATCH=tuned, the default) against
# cuBLAS's own choice (=blas). out/dev: this build; out/old: commit d579569's squeezekv.
# cuda_test, squeezekv_bench_ops at 64 rows, then `squeezekv bench -b` (Llama-3.1-8B shape,
# bf16 dummy weights, full cache, depth 512), new and old alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
NEWLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64 OLDLIB=$PWD/out/old/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; LD_LIBRARY_PATH=$NEWLIB timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|differ from|Expected|Which is|replayed" $OUT/cuda_test.txt | head -30
ops() { echo "== ops batch=$1"; LD_LIBRARY_PATH=$NEWLIB SQUEEZEKV_CUDA_BATCH=$1 timeout 120 out/dev/squeezekv_bench_ops --device cuda --config bench/configs/llama-3.1-8b.json --depths 512 --batch 64 --rounds 3 --filter " x"; }
{ ops tuned; ops blas; } 2>&1 | grep -v "^|---\|^| op" | tee $OUT/bench_ops.txt
b() { echo "== $1 $2 $3"; LD_LIBRARY_PATH=$([ $1 = new ] && echo $NEWLIB || echo $OLDLIB) env $2 timeout 170 out/$([ $1 = new ] && echo dev || echo old)/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json $3 2>&1 | grep -E "^\| (pp|tg)|error|rror" | tee -a $OUT/bench_batch.txt; }
b new X=1 "-p 0 -n 32 -d 512 -r 3 -b 1,8,16,32,64,128,256"
b old X=1 "-p 0 -n 32 -d 512 -r 3 -b 8,64,256"
b new SQUEEZEKV_CUDA_BATCH=blas "-p 0 -n 32 -d 512 -r 3 -b 8,64,256"
