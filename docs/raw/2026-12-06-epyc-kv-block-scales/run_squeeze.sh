#!/usr/bin/env bash
# Squeeze 512 at depth 8192 over f16, q8_0 and q4_1 rows, the default model, 2 threads, this
# commit's build, the types alternated, 3 rounds (issue 27: squeeze 512 with q8_0 not slower than
# squeeze 512 with f16).
m=models/SmolLM2-135M-Instruct.Q4_1.gguf
for r in 1 2 3; do for t in f16 q8_0 q4_1; do
  echo "$r $t $(./build/squeezekv bench -m $m -p 0 -n 128 -d 8192 -r 3 -t 2 --kv-type $t --kv-policy squeeze --kv-budget 512 2>&1 | grep -E '^\| tg' | cut -d'|' -f3)"
done; done
