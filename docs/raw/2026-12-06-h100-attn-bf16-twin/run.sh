#!/usr/bin/env bash
# The prompt attention's output written in bf16 too (the output product's operand, no conversion
# launch a layer; CudaOptions::attn_bf16_out) against the same build with it off
# (SQUEEZEKV_CUDA_ATTN_BF16=0: the conversion before the output product, as before), alternated, beside llama.cpp CUDA's llama-bench on a GGUF of the same 8B shape
# (random BF16 weights, bench/make_dummy_gguf.py), one device call; cuda_test first.
# Carry: out/devsys.tar.xz (dev/, sys/lib, peer/gguf-py), out/peer/llama.tar.xz.
#   OUT=DIR bash docs/raw/2026-12-06-h100-attn-bf16-twin/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-560} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out && tar xJf out/peer/llama.tar.xz -C out/peer
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
LL=$PWD/out/peer/llama/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64${nccl:+:$nccl}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee $OUT/gpu.txt
g=/dev/shm/gguf; mkdir -p $g
( PYTHONPATH=out/peer/gguf-py timeout 200 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json $g/8b.BF16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $?" >> $OUT/gguf.txt ) &
el "cuda_test"
timeout 200 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure" $OUT/cuda_test.txt | head -12
wait; cat $OUT/gguf.txt
C=bench/configs/llama-3.1-8b.json
ours() { echo "== squeezekv SQUEEZEKV_CUDA_ATTN_BF16=$1 $2" >> $OUT/bench.txt
  SQUEEZEKV_CUDA_ATTN_BF16=$1 timeout 100 out/dev/squeezekv bench --device cuda --dummy $C $2 -n 0 -r 5 2>&1 | grep -E "^\| pp|rror" >> $OUT/bench.txt; }
theirs() { echo "== llama.cpp" >> $OUT/bench.txt
  LD_LIBRARY_PATH=$LL timeout 100 out/peer/llama/bin/llama-bench -m $g/8b.BF16.gguf -ngl 99 -fa 1 -p 512,4096 -n 0 -r 5 2>&1 | grep -E "^\| |rror" >> $OUT/bench.txt; }
for r in 1 2 3; do
  el "round $r"
  left 80 && ours 1 "-p 512,4096"
  left 80 && ours 0 "-p 512,4096"
  left 60 && theirs
  if [ $r -le 2 ]; then
    left 80 && ours 1 "-p 4096 --kv-policy squeeze --kv-budget 1024"
    left 80 && ours 0 "-p 4096 --kv-policy squeeze --kv-budget 1024"
    left 80 && ours 1 "-p 512 --dummy-type Q4_K_M"
    left 80 && ours 0 "-p 512 --dummy-type Q4_K_M"
  fi
done
cat $OUT/bench.txt
el done
