#!/usr/bin/env bash
# BF16 and F16 decode rows three ways in one build (issue 32): the 512-bit row kernels as they are
# (dot_rows, dot_rows_f16: no software prefetch), the same with the rows 4 KB ahead asked for
# (SQUEEZEKV_CPU_HALF_ROWS_AHEAD=4096, as the f32 dot asks), and the exact f32 dot with its
# prefetch (SQUEEZEKV_CPU_HALF_ROWS=0); random weights of SmolLM2-135M's shape as BF16 and F16
# GGUFs (bench/make_dummy_gguf.py), `squeezekv bench -m FILE -p 0 -n 64 -r 3 -t T`, T = 1, 2, the
# three alternated, ROUNDS rounds (4).   OUT=DIR [ROUNDS=4] bash run.sh   (from the repository root;
# needs build/ and gguf-py: PYTHONPATH=out/peer/gguf-py or pip install gguf)
set -u
W=/tmp/halfrows; mkdir -p $W $OUT
for t in BF16 F16; do [ -f $W/d135.$t.gguf ] || python3 bench/make_dummy_gguf.py bench/configs/smollm2-135m.json $W/d135.$t.gguf --type $t > /dev/null; done
lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/cpu.txt
run() {  # label env type threads
  echo -n "$1 $3 t$4: " >> $OUT/bench.txt
  env $2 LD_LIBRARY_PATH=build build/squeezekv bench -m $W/d135.$3.gguf -p 0 -n 64 -r 3 -t $4 2>&1 | grep -E "^\| tg|rror" >> $OUT/bench.txt
}
for r in $(seq 1 ${ROUNDS:-4}); do
  echo "# round $r" >> $OUT/bench.txt
  for t in 1 2; do for ty in BF16 F16; do
    run rows "SQUEEZEKV_CPU_HALF_ROWS_AHEAD=0" $ty $t
    run rows+ahead4096 "SQUEEZEKV_CPU_HALF_ROWS_AHEAD=4096" $ty $t
    run f32dot "SQUEEZEKV_CPU_HALF_ROWS=0" $ty $t
  done; done
done
