#!/usr/bin/env bash
# The decode products of a batch through cuBLAS (SQUEEZEKV_CUDA_BATCH_MMA=blas, a measurement)
# against gemm_rows (=1): squeezekv_bench_ops at 8, 64 and 256 rows, then the whole step.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
for m in blas 1; do echo "== batch_mma=$m"; SQUEEZEKV_CUDA_BATCH_MMA=$m timeout 200 out/dev/squeezekv_bench_ops --device cuda --config bench/configs/llama-3.1-8b.json --depths 512 --batch 8,64,256 --rounds 3 --filter " x"; done 2>&1 | grep -v "^# \|^|---\|^| op" | tee $OUT/bench_ops_d.txt
b() { echo "== batch_mma=$1"; SQUEEZEKV_CUDA_BATCH_MMA=$1 timeout 200 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 0 -n 32 -d 512 -r 2 -b $2 2>&1 | grep -E "^\| (pp|tg)|error" | tee -a $OUT/bench_batch_d.txt; }
b blas 8,16,64,256; b 1 64; b blas 64
