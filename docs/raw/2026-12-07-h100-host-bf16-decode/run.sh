#!/usr/bin/env bash
# BF16 decode rows on vdpbf16ps (commit 9f87568) against the build before (860d341) on the GPU
# machine's 16 Xeon cores, CPU only: random BF16 weights of SmolLM2-135M's shape and of
# Llama-3.2-1B's (`--dummy CONFIG --dummy-type BF16`), `squeezekv bench -p 0 -n N -r 3 -t T`, the
# two builds alternated, two rounds. Carry out/ab.tar.xz (both builds' squeezekv and library, and
# out/sys's libraries).   OUT=DIR bash run.sh
set -u
tar xJf out/ab.tar.xz -C out
T0=$(date +%s)
lscpu | grep -E "Model name|^CPU\(s\)|Thread" > $OUT/cpu.txt
run() {  # build config n threads
  echo -n "$1 $(basename $2 .json) t$4: " >> $OUT/bench.txt
  LD_LIBRARY_PATH=$PWD/out/ab/$1:$PWD/out/ab/sys/lib timeout 100 out/ab/$1/squeezekv bench --dummy $2 --dummy-type BF16 -p 0 -n $3 -r 3 -t $4 2>&1 | grep -E "^\| tg|rror" >> $OUT/bench.txt
}
for r in 1 2; do
  echo "# round $r [$(( $(date +%s) - T0 )) s]" >> $OUT/bench.txt
  for t in 1 4 16; do for b in before after; do run $b bench/configs/smollm2-135m.json 64 $t; done; done
  for b in before after; do run $b bench/configs/llama-3.2-1b.json 16 16; done
done
echo "done [$(( $(date +%s) - T0 )) s]" >> $OUT/bench.txt
