#!/usr/bin/env bash
# Ring quads (issue 27, --kv-recent-f16): the build before (BASE, a build dir of the commit
# before) and this one (NEW) alternated, SmolLM2-135M-Instruct Q4_1, 2 threads, decode 64 at depth
# 8192 over q4_1 rows: squeeze 512 with 128 rows in f16 and without them; ROUNDS rounds,
# `squeezekv bench -r 3` medians. ops.txt: `squeezekv_bench_ops --kv-recent-f16` (commands in README.md).
#   BASE=/tmp/base2/build NEW=build MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf OUT=DIR [ROUNDS=3] \
#     bash docs/raw/2026-12-07-epyc-ring-quads/run.sh
set -u
run() { local b=$1; shift; echo "== $b $*" >> $OUT/bench.txt
  "$b/squeezekv" bench -m "$MODEL" -t 2 -p 0 -n 64 -d 8192 -r 3 --kv-type q4_1 "$@" 2>/dev/null | grep -E "^\| tg" >> $OUT/bench.txt; }
{ lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-200; } > $OUT/machine.txt
for r in $(seq 1 ${ROUNDS:-3}); do
  echo "# round $r" >> $OUT/bench.txt
  for b in $BASE $NEW; do run $b --kv-policy squeeze --kv-budget 512 --kv-recent-f16 128; done
  for b in $NEW $BASE; do run $b --kv-policy squeeze --kv-budget 512; done
done
cat $OUT/bench.txt
