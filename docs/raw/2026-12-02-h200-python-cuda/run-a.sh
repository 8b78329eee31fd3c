#!/usr/bin/env bash
# The GPU tests (ctest -L cuda's binary) and the Python package on CUDA (python_cuda.py), while
# llama.cpp's CUDA build (for ../2026-12-02-h200-q8-kv/run-d.sh, issue 27) runs on 12 of the 16 cores.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
DEVLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64
here=docs/raw/2026-12-02-h200-python-cuda
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
python3 --version; python3 -c "import numpy; print('numpy', numpy.__version__)"
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > $OUT/llama_build.txt 2>&1 &&
  timeout 480 cmake --build out/peer/build -j 12 --target llama-bench llama-batched-bench >> $OUT/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt ) &
echo "== cuda_test"; LD_LIBRARY_PATH=$DEVLIB timeout 240 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|Expected|Which is" $OUT/cuda_test.txt | head -30
echo "== python on cuda"; LD_LIBRARY_PATH=$DEVLIB PYTHONPATH=$PWD/out/dev/python timeout 240 python3 $here/python_cuda.py $PWD/out/dev/shared/models $PWD/out/dev/squeezekv 2>&1 | tee $OUT/python_cuda.txt | tail -20
wait; cat $OUT/llama_build_rc.txt; ls out/peer/build/bin 2>/dev/null | head
