#!/usr/bin/env bash
# CPU only (issue 32): BF16 and F16 decode rows three ways in one build on the GPU machine's CPU,
# beside llama.cpp built there for that CPU (-DGGML_NATIVE=ON, the llama-cpp-python 0.3.36 sdist):
# the 512-bit row kernels with no software prefetch (SQUEEZEKV_CPU_HALF_ROWS_AHEAD=0: `rows`, the
# default on AMD CPUs), the same asking for the rows 4 KB ahead (SQUEEZEKV_CPU_HALF_ROWS_AHEAD=4096:
# `ahead4096`, the default on Intel CPUs since 2026-12-08), the exact f32 dot with its prefetch
# (SQUEEZEKV_CPU_HALF_ROWS=0: `f32dot`); random weights of SmolLM2-135M's shape as BF16 and F16
# GGUFs (bench/make_dummy_gguf.py), `squeezekv bench -m FILE -p 0 -n 64 -r 3 -t T` and
# `llama-bench -m FILE -p 0 -n 64 -r 3 -t T`, the four alternated per file and thread count, rounds
# while LIMIT lasts. One device call with no GPU work in it (the device tool sets OUT):
#   carry out/devsys.tar.xz (bench/cuda/stage_device.sh's dev/ and sys/, packed as xz) and out/peer
#   (stage_device.sh --peer);   OUT=DIR [THREADS="1 4 16"] [LIMIT=550] bash bench/cpu_half_rows_device.sh
# Results: bench.txt (one line a run), steps.txt, machine.txt, llama_build.txt.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-550} - ($(date +%s) - T0) )) -ge "$1" ]; }
[ -x out/dev/squeezekv ] || tar xJf out/devsys.tar.xz -C out
W=/tmp/xhr; mkdir -p $W
{ lscpu; nproc; free -g; } > $OUT/machine.txt 2>&1
( if [ ! -x $W/build/bin/llama-bench ]; then
    mkdir -p $W/src && tar xJf out/peer/llama-src.tar.xz -C $W/src
    cmake -S $W/src/llama.cpp -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF \
      > $OUT/llama_build.txt 2>&1 && timeout 900 cmake --build $W/build -j $(nproc) --target llama-bench >> $OUT/llama_build.txt 2>&1
  fi; el "llama.cpp build rc $?" ) &
for t in BF16 F16; do
  [ -f $W/d135.$t.gguf ] || PYTHONPATH=out/peer/gguf-py python3 bench/make_dummy_gguf.py bench/configs/smollm2-135m.json $W/d135.$t.gguf --type $t > /dev/null
done
wait
for f in $W/d135.BF16.gguf $W/d135.F16.gguf $W/build/bin/llama-bench out/dev/squeezekv; do
  [ -e $f ] || { el "cpu_half_rows_device.sh: $f is missing (numpy and gguf-py for the files, out/peer for llama.cpp, out/devsys.tar.xz)"; exit 1; }
done
sq() {  # label env type threads
  echo -n "$1 $3 t$4: " >> $OUT/bench.txt
  env $2 LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib out/dev/squeezekv bench -m $W/d135.$3.gguf -p 0 -n 64 -r 3 -t $4 2>&1 | grep -E "^\| tg|rror" >> $OUT/bench.txt
}
lb() {  # type threads
  echo -n "llama.cpp $1 t$2: " >> $OUT/bench.txt
  LD_LIBRARY_PATH=$W/build/bin $W/build/bin/llama-bench -m $W/d135.$1.gguf -p 0 -n 64 -r 3 -t $2 2>&1 | grep -E "tg64|rror" >> $OUT/bench.txt
}
for r in 1 2 3 4 5; do
  left 150 || break
  echo "# round $r" >> $OUT/bench.txt; el "round $r"
  for t in ${THREADS:-1 4 16}; do for ty in BF16 F16; do
    left 20 || break
    sq rows "SQUEEZEKV_CPU_HALF_ROWS_AHEAD=0" $ty $t
    sq ahead4096 "SQUEEZEKV_CPU_HALF_ROWS_AHEAD=4096" $ty $t
    sq f32dot "SQUEEZEKV_CPU_HALF_ROWS=0" $ty $t
    lb $ty $t
  done; done
done
cat $OUT/bench.txt; el done
