#!/usr/bin/env bash
# AVX2's score tiles over key pairs for a GQA group of 3 (attention_kernel.h's score_pairs) against
# the library before, alternated, on this project's CPU machine (AMD EPYC, 2 vCPUs), the AVX2
# kernels chosen with SQUEEZEKV_CPU=avx2. BASE: a build of the commit before (a git worktree).
#   BASE=/tmp/basewt/build bash docs/raw/2026-12-06-epyc-avx2-q8-key-pairs/run.sh
set -u
NEW=${NEW:-build} M=${M:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
# one decode row alone (decode_row.txt: the microseconds at 8192 and 65536 keys)
for r in 1 2 3 4; do for t in q8_0 f16; do for b in $BASE $NEW; do
  echo "r$r $t $b $(SQUEEZEKV_CPU=avx2 $b/squeezekv_bench_ops --config bench/configs/smollm2-135m.json --depths 8192,65536 -t 2 \
    --batch 1 --kv-type $t --filter "attn decode N" 2>&1 | grep "attn decode N" | awk -F'|' '{printf "%s ", $4}')"
done; done; done
# end to end under squeeze 512 (squeeze.txt: tok/s; f16 keys take the same path in both builds)
for r in 1 2 3; do for t in q8_0 f16; do for b in $BASE $NEW; do
  [ $t = f16 ] && [ $b = $NEW ] && continue
  echo "r$r $t $b $(SQUEEZEKV_CPU=avx2 $b/squeezekv bench -m $M -p 0 -n 64 -d 8192 -r 2 -t 2 --kv-policy squeeze --kv-budget 512 \
    --kv-type $t 2>&1 | grep '^| tg' | awk -F'|' '{print $3}')"
done; done; done
