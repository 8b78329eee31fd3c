#!/usr/bin/env bash
# BF16 rows' decode (the fused dequantize-and-dot, one row at a time) with and without the rows
# ~4 KB ahead prefetched: the SmolLM2-135M shape with random BF16 weights (--dummy), 1 and 2
# threads, the two builds alternated three times.
# usage: run_bf16.sh BEFORE_BIN BEFORE_LIB_DIR AFTER_BIN
before=$1 before_lib=$2 after=$3
for round in 1 2 3; do
  for t in 1 2; do
    b=$(LD_LIBRARY_PATH=$before_lib $before bench --dummy bench/configs/smollm2-135m.json -p 0 -n 32 -r 3 -t $t 2>&1 | grep '^| tg' | cut -d'|' -f3)
    a=$($after bench --dummy bench/configs/smollm2-135m.json -p 0 -n 32 -r 3 -t $t 2>&1 | grep '^| tg' | cut -d'|' -f3)
    echo "round $round bf16 -t $t: before $b after $a tok/s"
  done
done
