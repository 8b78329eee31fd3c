#!/usr/bin/env bash
# The same card right after run.sh (machine still held): llama.cpp CUDA built there from the
# llama-cpp-python 0.3.36 sdist while squeezekv runs 64 x 4096 (split by the batch, and as alone)
# once more, then `llama-batched-bench -npp 4096 -ntg 32 -npl 64` beside squeezekv's default.
# 8B shape, random BF16 weights (ours --dummy, theirs a GGUF of the shape, bench/make_dummy_gguf.py).
# Carry: out/devsys.tar.xz, out/peer (bench/cuda/stage_device.sh --peer).
#   OUT=DIR [LIMIT=s] bash docs/raw/2026-12-07-h100-batch-splits/beside_llama.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-480} - ($(date +%s) - T0) )) -ge "$1" ]; }
[ -x out/dev/squeezekv ] || tar xJf out/devsys.tar.xz -C out
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
LL=$PWD/out/peer/build/bin:/usr/local/cuda/lib64
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > /tmp/llama_build.txt 2>&1 &&
  timeout 400 cmake --build out/peer/build -j 14 --target llama-batched-bench >> /tmp/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt; tail -3 /tmp/llama_build.txt >> $OUT/llama_build_rc.txt ) &
g=/dev/shm/gguf; mkdir -p $g
( PYTHONPATH=out/peer/gguf-py timeout 200 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json $g/8b.BF16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $?" >> $OUT/gguf.txt ) &
C=bench/configs/llama-3.1-8b.json B64="-p 0 -n 32 -b 64 -d 4096"
ours() { local s=$1; shift; echo "== SQUEEZEKV_CUDA_BATCH_SPLITS=$s squeezekv $*" >> $OUT/bench.txt; el "$s $*"
  SQUEEZEKV_CUDA_BATCH_SPLITS=$s timeout 150 out/dev/squeezekv bench --device cuda --dummy $C -r 3 "$@" 2>&1 | grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
echo "# during the llama.cpp build" >> $OUT/bench.txt
for s in batch lone batch lone; do left 60 && ours $s $B64; done
wait; cat $OUT/llama_build_rc.txt $OUT/gguf.txt
echo "# beside llama.cpp" >> $OUT/bench.txt
for r in 1 2; do
  left 60 && { echo "== llama-batched-bench -npp 4096 -ntg 32 -npl 64" >> $OUT/bench.txt; el "llama-batched-bench $r"
    LD_LIBRARY_PATH=$LL timeout 150 out/peer/build/bin/llama-batched-bench -m $g/8b.BF16.gguf -ngl 99 -fa on -pps -c 266000 -npp 4096 -ntg 32 -npl 64 2>&1 | grep -E "^\| |rror" >> $OUT/bench.txt; }
  left 20 && ours batch $B64
done
cat $OUT/bench.txt; el done
