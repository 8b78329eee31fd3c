#!/usr/bin/env bash
# The 8-row tile kernels' decode path with and without the weights' software prefetch (16 blocks
# ahead), the default model (SmolLM2-135M Q4_1), 1 and 2 threads, the AVX-512 VNNI kernels and the
# AVX2 ones (SQUEEZEKV_CPU=avx2), the two builds alternated three times. BEFORE: a binary and its
# libsqueezekv.so.0 of the commit before (in a folder of its own, LD_LIBRARY_PATH).
# usage: run.sh BEFORE_BIN BEFORE_LIB_DIR AFTER_BIN
before=$1 before_lib=$2 after=$3
lscpu | grep -E "^Model name|^CPU\(s\)"
for round in 1 2 3; do
  for cpu in native avx2; do
    for t in 1 2; do
      env=(); [ "$cpu" = avx2 ] && env=(SQUEEZEKV_CPU=avx2)
      b=$(env "${env[@]}" LD_LIBRARY_PATH=$before_lib $before bench -p 0 -n 64 -r 3 -t $t 2>&1 | grep '^| tg' | cut -d'|' -f3)
      a=$(env "${env[@]}" $after bench -p 0 -n 64 -r 3 -t $t 2>&1 | grep '^| tg' | cut -d'|' -f3)
      echo "round $round $cpu -t $t: before $b after $a tok/s"
    done
  done
  echo "round $round prompt 512 -t 2: before $(LD_LIBRARY_PATH=$before_lib $before bench -p 512 -n 0 -r 3 -t 2 2>&1 | grep '^| pp' | cut -d'|' -f3) after $($after bench -p 512 -n 0 -r 3 -t 2 2>&1 | grep '^| pp' | cut -d'|' -f3) tok/s"
done
