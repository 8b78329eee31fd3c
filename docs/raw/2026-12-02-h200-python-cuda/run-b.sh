#!/usr/bin/env bash
# run-a.sh's llama.cpp build did not survive (carrying out/peer again replaced it): the build again,
# into out/peer/build, which the next call keeps by not carrying out/peer; meanwhile the extension
# is compiled for this machine's Python (3.12; the carried one is 3.11's) against the carried
# library, and python_cuda.py runs with it.
set -u
DEVLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64
here=docs/raw/2026-12-02-h200-python-cuda
mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
  cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > $OUT/llama_build.txt 2>&1 &&
  timeout 480 cmake --build out/peer/build -j 12 --target llama-bench llama-batched-bench >> $OUT/llama_build.txt 2>&1
  echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt ) &
inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
suffix=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
ls $inc/Python.h; g++ --version | head -1
pkg=/tmp/pkg; mkdir -p $pkg/squeezekv && cp python/squeezekv/*.py python/squeezekv/py.typed $pkg/squeezekv/
t0=$(date +%s)
g++ -std=c++20 -O2 -fPIC -shared -fvisibility=hidden -Iinclude -Itools -Iout/dev/inc -I$inc python/src/module.cc \
  out/dev/lib/libsqueezekv_eval.a -Lout/dev/lib -l:libsqueezekv.so.0 -Wl,-rpath,$PWD/out/dev/lib -o $pkg/squeezekv/_core$suffix 2>&1 | tail -5
echo "extension built in $(( $(date +%s) - t0 )) s"
echo "== python on cuda"; LD_LIBRARY_PATH=$DEVLIB PYTHONPATH=$pkg timeout 300 python3 $here/python_cuda.py $PWD/out/dev/shared/models $PWD/out/dev/squeezekv 2>&1 | tee $OUT/python_cuda.txt | tail -20
wait; cat $OUT/llama_build_rc.txt
