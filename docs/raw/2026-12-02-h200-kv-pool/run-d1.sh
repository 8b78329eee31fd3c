#!/usr/bin/env bash
# The peer for run-d2.sh, built on the GPU machine (16 cores): llama.cpp CUDA from the
# llama-cpp-python 0.3.36 sdist (its vendor/llama.cpp, the sources it needs, carried as
# out/peer/llama-src.tar.xz), sm_90, llama-batched-bench and llama-bench only; its GGUF written by
# bench/make_dummy_gguf.py (Llama-3.1-8B shape, random BF16 weights) with gguf-py from the same
# sdist; then cuda_test on this commit's build (out/dev).
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
( LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 120 out/dev/cuda_test > $OUT/cuda_test_d.txt 2>&1; echo "cuda_test rc $?" > $OUT/cuda_test_rc.txt ) &
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
export PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
cmake -S out/peer/src -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > $OUT/llama_build.txt 2>&1 || { tail -20 $OUT/llama_build.txt; exit 1; }
wait  # cuda_test first, alone on the GPU
cat $OUT/cuda_test_rc.txt; grep -E "FAILED|PASSED|Failure" $OUT/cuda_test_d.txt | head -10
timeout 420 cmake --build out/peer/build -j 16 --target llama-batched-bench llama-bench >> $OUT/llama_build.txt 2>&1; echo "build rc $? in $(( $(date +%s) - t0 )) s"
ls out/peer/build/bin | head -20
PYTHONPATH=$PWD/out/peer/gguf-py timeout 200 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json out/peer/l8b.gguf; ls -la out/peer/l8b.gguf
