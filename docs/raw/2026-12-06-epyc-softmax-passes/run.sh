#!/usr/bin/env bash
# The CPU attention tile's softmax passes (commit beside this file) against the build before it
# (a worktree of its parent at /work/ab-old), this project's CPU machine (AMD EPYC, family 26,
# AVX-512, 2 vCPUs), the default model, 2 threads, builds alternated:
#   decode at depth 8192, f16 and q8_0 rows, 3 rounds; squeeze 512 over q8_0 rows and a 512-token
#   prompt after 4096, 2 rounds; the prompt alone 3 more rounds (new build first).
m=models/SmolLM2-135M-Instruct.Q4_1.gguf
for r in 1 2 3; do for b in old new; do [ $b = old ] && bin=/work/ab-old/build/squeezekv || bin=./build/squeezekv
  for t in f16 q8_0; do echo "== $r $b $t $($bin bench -m $m -p 0 -n 64 -d 8192 -r 3 -t 2 --kv-type $t 2>&1 | grep -E '^\| tg' | cut -d'|' -f3)"; done; done; done
for r in 1 2; do for b in old new; do [ $b = old ] && bin=/work/ab-old/build/squeezekv || bin=./build/squeezekv
  echo "== $r $b sq512 q8 $($bin bench -m $m -p 0 -n 128 -d 8192 -r 3 -t 2 --kv-type q8_0 --kv-policy squeeze --kv-budget 512 2>&1 | grep -E '^\| tg' | cut -d'|' -f3) pp512@4096 $($bin bench -m $m -p 512 -n 0 -d 4096 -r 3 -t 2 2>&1 | grep -E '^\| pp' | cut -d'|' -f3)"; done; done
for r in 1 2 3; do for b in new old; do [ $b = old ] && bin=/work/ab-old/build/squeezekv || bin=./build/squeezekv
  echo "== $r $b pp512@4096 $($bin bench -m $m -p 512 -n 0 -d 4096 -r 3 -t 2 2>&1 | grep -E '^\| pp' | cut -d'|' -f3)"; done; done
