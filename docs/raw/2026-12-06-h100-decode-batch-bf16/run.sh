#!/usr/bin/env bash
# A decode batch's attention output written in bf16 too by the tensor-core kernel and the splits'
# merge (the output product's operand: no conversion launch a layer), on (the default) and off
# (SQUEEZEKV_CUDA_ATTN_BF16=0) alternated in one build, beside llama.cpp CUDA's
# llama-batched-bench on a GGUF of the same 8B shape (random BF16 weights, bench/make_dummy_gguf.py),
# one device call; cuda_test first.
# Carry: out/devsys.tar.xz (dev/, sys/lib, peer/gguf-py), out/peer/llama.tar.xz (llama-bench's
# build, bench/cuda/build_llamacpp_cuda.sh) and out/peer/llama-bb.tar.xz (llama-batched-bench of
# the same build).   OUT=DIR bash docs/raw/2026-12-06-h100-decode-batch-bf16/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-560} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out && tar xJf out/peer/llama.tar.xz -C out/peer && tar xJf out/peer/llama-bb.tar.xz -C out/peer
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
  SQUEEZEKV_CUDA_ATTN_BF16=$1 timeout 100 out/dev/squeezekv bench --device cuda --dummy $C -p 0 -n 32 -r 3 $2 2>&1 | grep -E "^\| tg|rror" >> $OUT/bench.txt; }
theirs() { echo "== llama-batched-bench $*" >> $OUT/bench.txt
  LD_LIBRARY_PATH=$LL timeout 150 out/peer/llama/bin/llama-batched-bench -m $g/8b.BF16.gguf -ngl 99 -fa on -pps -ntg 32 "$@" 2>&1 | grep -E "^\| |rror" >> $OUT/bench.txt; }
for r in 1 2 3; do
  el "round $r"
  if [ $((r % 2)) = 1 ]; then a=1 b=0; else a=0 b=1; fi
  left 60 && ours $a "-b 64 -d 512"
  left 60 && ours $b "-b 64 -d 512"
  left 60 && theirs -c 70000 -npp 512 -npl 64,128
  left 60 && ours $a "-b 128 -d 512"
  left 60 && ours $b "-b 128 -d 512"
  if [ $r -le 2 ]; then
    left 80 && ours $a "-b 64 -d 4096 --kv-policy squeeze --kv-budget 1024"
    left 80 && ours $b "-b 64 -d 4096 --kv-policy squeeze --kv-budget 1024"
  fi
  [ $r = 1 ] && left 120 && theirs -c 266000 -npp 4096 -npl 64
done
cat $OUT/bench.txt
el done
