#!/usr/bin/env bash
# Third call, the build of the commit beside this file: 128 weight rows a block fixed, gemm_rows_q
# for decode batches of 17-64 rows and the dequantization to bf16 past them: the whole cuda_test,
# then the 8B shape in Q4_K_M at context 512 for B = 32, 64, 128 (the path each B takes now).
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
timeout 100 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "cuda_test rc $?"
grep -E "FAILED|Failure|PASSED|packed weights|native:" $OUT/cuda_test.txt | head -20
timeout 100 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json --dummy-type Q4_K_M -p 0 -n 32 -d 512 -r 3 -b 32,64,128 2>&1 | grep -E "^\| (pp|tg)|rror" | tee $OUT/squeezekv_bench.txt
