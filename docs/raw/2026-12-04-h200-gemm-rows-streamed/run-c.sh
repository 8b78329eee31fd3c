#!/usr/bin/env bash
# The build to be committed (out/dev: steps of 128 columns up to 32 rows a block, 64 past that):
# cuda_test, then decode batches with the products on cuBLASLt as tuned (the default), on
# gemm_rows (SQUEEZEKV_CUDA_BATCH=mma) and on the 4-row GEMV (--batch-invariant on today),
# alternated twice. 8B shape, bf16 dummy weights, f16 KV.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
C=bench/configs/llama-3.1-8b.json
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $OUT/gpu.txt
timeout 200 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure|batched products" $OUT/cuda_test.txt | head -12
sb() { timeout 120 out/dev/squeezekv bench --dummy $C --device cuda -p 0 -r 3 "$@" 2>&1 | grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
for round in 1 2; do
  for v in tuned mma gemv; do
    echo "== $v round $round" >> $OUT/bench.txt
    case $v in
      tuned) export SQUEEZEKV_CUDA_BATCH=tuned ;;
      mma) export SQUEEZEKV_CUDA_BATCH=mma ;;
      gemv) export SQUEEZEKV_CUDA_BATCH=gemv ;;
    esac
    if [ $v = gemv ]; then sb -b 64 -d 512 -n 16; continue; fi
    sb -b 16 -d 512 -n 64
    sb -b 64 -d 512 -n 64
    sb -b 128 -d 512 -n 64
    sb -b 64 -d 4096 -n 32 --kv-policy squeeze --kv-budget 1024
  done
done
unset SQUEEZEKV_CUDA_BATCH
sb -d 0 -n 64
cat $OUT/bench.txt
