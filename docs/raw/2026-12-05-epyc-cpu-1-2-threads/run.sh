#!/usr/bin/env bash
# This project's CPU machine (AMD EPYC, family 26, AVX-512 with VNNI and BF16, 2 vCPUs), commit
# of the README beside this file: the default model (Q4_1) and llama.cpp's own re-quantizations of
# it to Q4_0 and Q8_0 (`llama-quantize --allow-requantize`), llama.cpp built here from the
# llama-cpp-python 0.3.36 sdist (`-DGGML_NATIVE=ON`, CPU only, llama-bench and llama-quantize);
# squeezekv bench and llama-bench alternated per file and thread count, 2 rounds of -r 3.
cd /tmp/cpucmp
for round in 1 2; do
 for f in Q4_0 Q4_1 Q8_0; do
  for t in 1 2; do
   echo "== round $round $f t$t squeezekv"; /work/main/build/squeezekv bench -m s.$f.gguf -t $t -p 512 -n 128 -r 3 2>&1 | grep -E "^\| (pp|tg)"
   echo "== round $round $f t$t llama.cpp"; /tmp/llsrc/build-cpu/bin/llama-bench -m s.$f.gguf -t $t -p 512 -n 128 -r 3 2>&1 | grep -E "^\| "| grep -E "pp|tg"
  done
 done
done
