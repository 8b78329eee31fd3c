#!/usr/bin/env bash
# Many sequences with f16 and q8_0 KV rows (the tensor-core decode kernel reads both since
# 2026-12-06) beside llama.cpp CUDA's llama-batched-bench (f16 and q8_0 K/V, -fa on) in one
# device call, the engines alternated: 64 x 512; 64 x 4096 under squeeze 1024 (ours) against the
# full cache (theirs); and at context 32768 the full cache with as many sequences as the GPU holds
# (14 with f16 rows, 28 with q8_0 on an 80 GB card), both engines at the same B. The 8B shape with
# random BF16 weights (ours --dummy, theirs a GGUF from bench/make_dummy_gguf.py).
# Carry: out/benchsys.tar.xz (dev/ without the tests, sys/lib without libssl/libcrypto, which the
# image's python3 brings, peer/gguf-py) and out/peer/llama.tar.xz (bench/cuda/build_llamacpp_cuda.sh):
# with the tree they fill the call's 64 MiB.   OUT=DIR bash docs/raw/2026-12-06-h100-serving-q8/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-570} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/benchsys.tar.xz -C out && tar xJf out/peer/llama.tar.xz -C out/peer
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
LL=$PWD/out/peer/llama/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64${nccl:+:$nccl}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee $OUT/gpu.txt
ldd out/dev/squeezekv out/dev/lib/*.so* | grep "not found" | sort -u | tee $OUT/ldd.txt
g=/dev/shm/gguf; mkdir -p $g
( PYTHONPATH=out/peer/gguf-py timeout 200 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json $g/8b.BF16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $?" >> $OUT/gguf.txt ) &
C=bench/configs/llama-3.1-8b.json
ours() { echo "== squeezekv $*" >> $OUT/bench.txt
  timeout 150 out/dev/squeezekv bench --device cuda --dummy $C -p 0 -n 32 -r 3 "$@" 2>&1 | grep -E "^\| tg|rror" >> $OUT/bench.txt; }
theirs() { echo "== llama-batched-bench $*" >> $OUT/bench.txt
  LD_LIBRARY_PATH=$LL timeout 200 out/peer/llama/bin/llama-batched-bench -m $g/8b.BF16.gguf -ngl 99 -fa on -pps -ntg 32 "$@" 2>&1 | grep -E "^\| |rror" >> $OUT/bench.txt; }
el "ours while the GGUF is written"
ours -b 64 -d 512
ours -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024
ours -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024 --kv-type q8_0
wait; cat $OUT/gguf.txt
for r in 1 2; do
  el "round $r"
  left 60 && theirs -c 70000 -npp 512 -npl 64
  left 60 && ours -b 64 -d 512
  left 80 && theirs -c 266000 -npp 4096 -npl 64
  left 60 && ours -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024
  left 60 && ours -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024 --kv-type q8_0
done
el "context 32768"
left 60 && ours -b 14 -d 32768
left 120 && theirs -c 459200 -npp 32768 -npl 14
left 60 && ours -b 28 -d 32768 --kv-type q8_0
left 150 && theirs -c 918400 -npp 32768 -npl 28 -ctk q8_0 -ctv q8_0
left 60 && ours -b 14 -d 32768 --kv-type q8_0
cat $OUT/bench.txt
el done
