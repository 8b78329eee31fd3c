#!/usr/bin/env bash
# The device machine's 16 CPU cores (no GPU work in this call), issue 32: llama.cpp built here for
# this CPU from the llama-cpp-python 0.3.36 sdist (CPU only), the SmolLM2-135M shape written with
# random BF16 weights by bench/make_dummy_gguf.py and quantized by llama.cpp's own llama-quantize
# to Q4_0, Q4_K_M and Q8_0; both engines read the same four files. bench/cpu_threads.sh: 3 rounds,
# threads 1 2 4 8 16, prompt 512 and decode 128, the engines alternating.
set -u
W=/tmp/cpu32; mkdir -p $W/gguf $OUT
{ lscpu; nproc; free -g; } > $OUT/machine.txt 2>&1
t0=$(date +%s)
( if [ ! -x $W/build/bin/llama-bench ]; then
    mkdir -p $W/src && tar xJf out/peer/llama-src.tar.xz -C $W/src
    cmake -S $W/src/llama.cpp -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF \
      > $OUT/llama_build.txt 2>&1 && timeout 300 cmake --build $W/build -j 16 --target llama-bench llama-quantize >> $OUT/llama_build.txt 2>&1
  fi; echo "llama.cpp build rc $? at $(( $(date +%s) - t0 )) s" >> $OUT/steps.txt ) &
for cfg in ${CONFIGS:-smollm2-135m}; do
  [ -f $W/gguf/$cfg.BF16.gguf ] || PYTHONPATH=out/peer/gguf-py python3 bench/make_dummy_gguf.py bench/configs/$cfg.json $W/gguf/$cfg.BF16.gguf >> $OUT/steps.txt 2>&1
done
wait
export LD_LIBRARY_PATH=$W/build/bin
for cfg in ${CONFIGS:-smollm2-135m}; do
  for q in ${TYPES:-Q4_0 Q4_K_M Q8_0}; do
    [ -f $W/gguf/$cfg.$q.gguf ] || $W/build/bin/llama-quantize $W/gguf/$cfg.BF16.gguf $W/gguf/$cfg.$q.gguf $q > /dev/null 2>> $OUT/steps.txt
  done
done
echo "files ready at $(( $(date +%s) - t0 )) s" >> $OUT/steps.txt; ls -la $W/gguf >> $OUT/steps.txt
files=""; for cfg in ${CONFIGS:-smollm2-135m}; do for q in ${BENCH_TYPES:-BF16 Q4_0 Q4_K_M Q8_0}; do files="$files $W/gguf/$cfg.$q.gguf"; done; done
cat > $W/sq <<EOS
#!/bin/sh
exec env LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/base/lib $PWD/out/dev/squeezekv "\$@"
EOS
chmod +x $W/sq
bash bench/cpu_threads.sh $OUT/runs $W/sq $W/build/bin/llama-bench "${THREADS:-1 2 4 8 16}" ${ROUNDS:-3} $files
echo "benches done at $(( $(date +%s) - t0 )) s" >> $OUT/steps.txt
python3 bench/cpu_threads_report.py $OUT/runs > $OUT/table.md; cat $OUT/steps.txt; cat $OUT/table.md
