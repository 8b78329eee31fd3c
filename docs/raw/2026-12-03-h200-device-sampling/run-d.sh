#!/usr/bin/env bash
# Fourth call: the build of commit 4771e2c (`squeezekv bench -b` picks its greedy tokens on the
# device) beside llama.cpp CUDA in the same call, 8B shape, bf16 weights, context 512, B = 8, 64,
# 128, 256: llama.cpp (llama-batched-bench) built in the background from the llama-cpp-python
# sdist while its BF16 GGUF is written and squeezekv runs its first round; then llama.cpp, then
# squeezekv's second round.
set -u
DEVLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64 PEERLIB=$PWD/out/peer/build/bin:/usr/local/cuda/lib64
cfg=bench/configs/llama-3.1-8b.json
g=/tmp/gguf; mkdir -p $g
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > /tmp/llama_build.txt 2>&1 &&
  timeout 360 cmake --build out/peer/build -j 14 --target llama-batched-bench >> /tmp/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt ) &
( t0=$(date +%s); PYTHONPATH=out/peer/gguf-py timeout 200 python3 bench/make_dummy_gguf.py $cfg $g/bf16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $? in $(( $(date +%s) - t0 )) s" >> $OUT/gguf.txt ) &
sb() { echo "== squeezekv $*"; LD_LIBRARY_PATH=$DEVLIB timeout 100 out/dev/squeezekv bench --device cuda --dummy $cfg -p 0 -n 32 -d 512 -r 3 "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/squeezekv_bench_d.txt; }
lb() { echo "== llama.cpp $*"; LD_LIBRARY_PATH=$PEERLIB timeout 120 out/peer/build/bin/llama-batched-bench -m $g/bf16.gguf -ngl 99 -fa on -pps "$@" 2>&1 | grep -E "^\|  *[0-9]|error|failed" | tee -a $OUT/llama_batched_d.txt; }
sb -b 8,64,128,256
wait; cat $OUT/llama_build_rc.txt; tail -1 $OUT/gguf.txt
lb -c 139264 -npp 512 -ntg 32 -npl 8,64,128,256
sb -b 8,64,128,256
