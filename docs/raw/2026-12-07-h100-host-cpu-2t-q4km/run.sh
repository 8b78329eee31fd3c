#!/usr/bin/env bash
# The cells of issue 32's Xeon table that no call had measured (CPU only, the GPU machine's 16
# cores): every type of the SmolLM2-135M shape at 2 threads, and Q4_K_M at 1 and 16, squeezekv
# beside llama.cpp built here (-DGGML_NATIVE=ON, the llama-cpp-python 0.3.36 sdist), the engines
# alternated per file and thread count (bench/cpu_threads.sh, `-p 512 -n 128`), rounds while the
# deadline allows; random BF16 weights of the shape (bench/make_dummy_gguf.py), llama-quantize's
# Q4_0, Q4_K_M, Q8_0 of it.
# Carry: out/devsys.tar.xz (bench/cuda/stage_device.sh), out/peer.   OUT=DIR [LIMIT=200] bash .../run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
L=${LIMIT:-200}
tar xJf out/devsys.tar.xz -C out
W=/tmp/cpu32; mkdir -p $W/gguf $W/src
{ lscpu; nproc; free -g; } > $OUT/machine.txt 2>&1
( tar xJf out/peer/llama-src.tar.xz -C $W/src
  cmake -S $W/src/llama.cpp -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF \
    > $OUT/llama_build.txt 2>&1 && timeout 150 cmake --build $W/build -j 16 --target llama-bench llama-quantize >> $OUT/llama_build.txt 2>&1
  el "llama.cpp build rc $?" ) &
PYTHONPATH=out/peer/gguf-py python3 bench/make_dummy_gguf.py bench/configs/smollm2-135m.json $W/gguf/smollm2-135m.BF16.gguf >> $OUT/steps.txt 2>&1
wait
export LD_LIBRARY_PATH=$W/build/bin
for q in Q4_0 Q4_K_M Q8_0; do $W/build/bin/llama-quantize $W/gguf/smollm2-135m.BF16.gguf $W/gguf/smollm2-135m.$q.gguf $q > /dev/null 2>> $OUT/steps.txt; done
el "files ready"
cat > $W/sq <<EOS
#!/bin/sh
exec env LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib $PWD/out/dev/squeezekv "\$@"
EOS
chmod +x $W/sq
f() { echo $W/gguf/smollm2-135m.$1.gguf; }
for r in 1 2 3; do
  [ $(( $(date +%s) - T0 )) -lt $((L - 60)) ] || break
  FIRST_ROUND=$r bash bench/cpu_threads.sh $OUT/runs $W/sq $W/build/bin/llama-bench "2" 1 $(f BF16) $(f Q4_0) $(f Q4_K_M) $(f Q8_0)
  [ $(( $(date +%s) - T0 )) -lt $((L - 30)) ] || break
  FIRST_ROUND=$r bash bench/cpu_threads.sh $OUT/runs $W/sq $W/build/bin/llama-bench "1 16" 1 $(f Q4_K_M)
  el "round $r done"
done
python3 bench/cpu_threads_report.py $OUT/runs > $OUT/table.md; cat $OUT/steps.txt $OUT/table.md
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $OUT/runs
