#!/usr/bin/env bash
# Decode at depth 8192 with f16 and q8_0 rows, the default model, 2 threads: this commit's build
# against its parent's (/work/ab-old), alternated, 5 rounds (issue 27's line: q8_0 at least 1.3x
# its f16 decode).
m=models/SmolLM2-135M-Instruct.Q4_1.gguf
for r in 1 2 3 4 5; do for b in old new; do [ $b = old ] && bin=/work/ab-old/build/squeezekv || bin=./build/squeezekv
  for t in f16 q8_0; do echo "$r $b $t $($bin bench -m $m -p 0 -n 64 -d 8192 -r 3 -t 2 --kv-type $t 2>&1 | grep -E '^\| tg' | cut -d'|' -f3)"; done; done; done
