#!/usr/bin/env bash
# BF16 decode on this CPU machine, the build before and after BF16 decode rows went to vdpbf16ps
# (issue 32), beside llama.cpp, alternated per thread count, three rounds.
#   BEFORE=/path/to/build/of/the/commit/before  LLAMA=/path/to/llama.cpp  bash run.sh OUT.txt
# llama.cpp: the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp, `cmake -DGGML_NATIVE=ON
# -DLLAMA_CURL=OFF -DGGML_CUDA=OFF`, targets llama-bench; the file: bench/make_dummy_gguf.py
# bench/configs/smollm2-135m.json (random BF16 weights of SmolLM2-135M's shape).
set -eu
out="${1:?usage: run.sh OUT.txt}"; : > "$out"
M=${M:-/tmp/llcpu/smollm2-135m.BF16.gguf}
for r in 1 2 3; do for t in 1 2; do
  for b in "$BEFORE" "$PWD/build"; do
    echo -n "r$r t$t $b: " >> "$out"
    LD_LIBRARY_PATH=$b $b/squeezekv bench -m "$M" -t $t -p 0 -n 128 -r 3 2>&1 | grep -E "^\| tg" >> "$out"
  done
  echo -n "r$r t$t llama.cpp: " >> "$out"
  "$LLAMA"/build/bin/llama-bench -m "$M" -t $t -p 0 -n 128 -r 3 2>&1 | grep -E "tg128" >> "$out"
done; done
