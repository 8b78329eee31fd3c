#!/usr/bin/env bash
# 64 and 128 sequences at depth 512, 64 decode steps, 8B shape, bf16, beside llama.cpp CUDA in the
# same call: llama.cpp (llama-batched-bench, built here from the llama-cpp-python 0.3.36 sdist in
# the background while its BF16 GGUF is written by bench/make_dummy_gguf.py and squeezekv, commit
# 55d5e05, runs a first round), then llama.cpp, then squeezekv's second round.
set -u
lib() { echo "$PWD/out/$1/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64"; }
PEERLIB=$PWD/out/peer/build/bin:/usr/local/cuda/lib64
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
sb() { echo "== squeezekv" >> $OUT/squeezekv_bench_e.txt; LD_LIBRARY_PATH=$(lib dev) timeout 100 out/dev/squeezekv bench --device cuda --dummy $cfg \
  -b 64,128 -p 0 -d 512 -n 64 -r 3 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/squeezekv_bench_e.txt; }
echo "# round 1 (llama.cpp building beside it)" >> $OUT/squeezekv_bench_e.txt; sb
wait; cat $OUT/llama_build_rc.txt; tail -1 $OUT/gguf.txt; tail -5 /tmp/llama_build.txt > $OUT/llama_build_tail.txt
for B in 64 128; do
  echo "== llama.cpp -pps -npp 512 -ntg 64 -npl $B" | tee -a $OUT/llama_batched_e.txt
  LD_LIBRARY_PATH=$PEERLIB timeout 90 out/peer/build/bin/llama-batched-bench -m $g/bf16.gguf -ngl 99 -fa on -pps -c $((B * 576)) -npp 512 \
    -ntg 64 -npl $B 2>&1 | grep -E "^\|  *[0-9]|error|failed" | tee -a $OUT/llama_batched_e.txt
done
echo "# round 2" >> $OUT/squeezekv_bench_e.txt; sb
