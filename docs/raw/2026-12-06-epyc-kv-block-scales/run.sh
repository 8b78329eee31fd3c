#!/usr/bin/env bash
# The CPU attention tile reading a quantized row's block scales once per block (commit beside
# this file) against the library before it (/tmp/libold: its parent's build), one decode row of
# SmolLM2's shape (9 query heads over 3 kv heads, head dim 64) at 8192 and 65536 keys, each KV
# type, 2 threads, squeezekv_bench_ops (this commit's; --kv-type), the two libraries alternated
# per type, 5 rounds.
for r in 1 2 3 4 5; do for t in f16 q8_0 q4_0 q4_1; do for lib in old new; do [ $lib = old ] && L=/tmp/libold || L=$PWD/build
    LD_LIBRARY_PATH=$L ./build/squeezekv_bench_ops --config bench/configs/smollm2-135m.json --depths 8192,65536 -t 2 --batch 1 \
      --kv-type $t --filter "attn decode" | grep -E "^\| attn" | awk -F'|' -v p="$r $lib $t" '{printf "%s |%s|%s\n", p, $2, $4}'
  done; done; done
