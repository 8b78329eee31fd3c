#!/usr/bin/env bash
# BF16 decode rows on vdpbf16ps (commit 9f87568) and F16 decode rows in 16 lanes (4fc9a84)
# (the build of 51a90da) against the build before both (860d341) on the GPU machine's 16 Xeon cores, CPU only, beside
# llama.cpp's CPU build of the same files: random weights of SmolLM2-135M's shape written as BF16
# and as F16 GGUFs there (bench/make_dummy_gguf.py, --type F16 for the second), `squeezekv bench
# -m FILE -p 0 -n 64 -r 3 -t T` and `llama-bench -m FILE -p 0 -n 64 -r 3 -t T`, the three
# alternated, T = 1, 4, 16, two rounds.
# Carry: out/ab.tar.xz (ab/before, ab/after: each build's squeezekv and library; ab/sys: out/sys's
# libraries) and out/peer (llama.cpp's source from the llama-cpp-python sdist, its gguf-py).
#   OUT=DIR [LLAMA=0] [THREADS="1 4 16"] bash run.sh   (LLAMA=0: the two builds alone, no llama.cpp)
set -u
tar xJf out/ab.tar.xz -C out
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Flags" | sed 's/^Flags:.*\(avx512_bf16\).*/Flags: ... \1 .../' > $OUT/cpu.txt
W=/tmp/hostab; mkdir -p $W
[ "${LLAMA:-1}" = 1 ] && ( mkdir -p $W/ll && tar xJf out/peer/llama-src.tar.xz -C $W/ll && cd $W/ll/llama.cpp &&
  cmake -S . -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_CUDA=OFF -DCMAKE_BUILD_TYPE=Release > $W/ll.cfg 2>&1 &&
  cmake --build build -j 16 --target llama-bench > $W/ll.build 2>&1; echo "llama.cpp build rc $?" >> $OUT/steps.txt ) &
for t in BF16 F16; do PYTHONPATH=out/peer/gguf-py python3 bench/make_dummy_gguf.py bench/configs/smollm2-135m.json $W/d135.$t.gguf --type $t >> $OUT/steps.txt 2>&1; done
wait; el "files and llama.cpp ready"
LLB=$W/ll/llama.cpp/build/bin/llama-bench
run() {  # engine type threads
  echo -n "$1 $2 t$3: " >> $OUT/bench.txt
  if [ $1 = llama.cpp ]; then timeout 100 $LLB -m $W/d135.$2.gguf -p 0 -n 64 -r 3 -t $3 2>&1 | grep -E "tg64|rror" | tr -s ' ' >> $OUT/bench.txt
  else LD_LIBRARY_PATH=$PWD/out/ab/$1:$PWD/out/ab/sys/lib timeout 100 out/ab/$1/squeezekv bench -m $W/d135.$2.gguf -p 0 -n 64 -r 3 -t $3 2>&1 | grep -E "^\| tg|rror" >> $OUT/bench.txt; fi
}
for r in 1 2; do
  el "round $r"; echo "# round $r" >> $OUT/bench.txt
  for t in ${THREADS:-1 4 16}; do for ty in BF16 F16; do for e in before after $([ "${LLAMA:-1}" = 1 ] && echo llama.cpp); do run $e $ty $t; done; done; done
done
el "done"
