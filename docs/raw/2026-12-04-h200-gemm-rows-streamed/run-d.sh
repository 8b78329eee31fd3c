#!/usr/bin/env bash
# --batch-invariant on as gemm_rows for every decode row, a lone sequence's too (out/dev):
# cuda_test (DecodeBatchIsBatchInvariant: 8 and 128 sequences bit-equal to alone), then one
# sequence and decode batches in that mode, by default, and on the 4-row GEMV (the invariant mode
# until now: SQUEEZEKV_CUDA_BATCH=gemv), alternated twice. 8B shape, bf16 dummy weights, f16 KV.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
C=bench/configs/llama-3.1-8b.json
timeout 200 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure|batch-invariant" $OUT/cuda_test.txt | head -12
sb() { timeout 100 out/dev/squeezekv bench --dummy $C --device cuda -p 0 -r 3 "$@" 2>&1 | grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
for round in 1 2; do
  for v in default invariant gemv; do
    echo "== $v round $round" >> $OUT/bench.txt
    case $v in
      default) sb -d 0 -n 64; sb -d 4096 -n 64; sb -b 16 -d 512 -n 32 ;;
      invariant) sb -d 0 -n 64 --batch-invariant on; sb -d 4096 -n 64 --batch-invariant on; sb -b 16 -d 512 -n 32 --batch-invariant on
                 sb -b 64 -d 512 -n 32 --batch-invariant on ;;
      gemv) SQUEEZEKV_CUDA_BATCH=gemv sb -d 0 -n 64; SQUEEZEKV_CUDA_BATCH=gemv sb -b 16 -d 512 -n 16 ;;
    esac
  done
done
cat $OUT/bench.txt
