#!/usr/bin/env bash
# 2026-11-30, commit 3d240b4 run 3: build p (= n + SK_KEYS / SK_PER_SM read from the environment: the decode
# split's fewest keys and the splits per SM; a measurement build, not committed): squeeze 2048 at
# 8192 and depth 0 across split settings.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/p/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64
B=out/dev/squeezekv
C=bench/configs/llama-3.1-8b.json
t0=$(date +%s)
for cfg in 64:4 32:4 128:4 256:4 128:8 64:4; do
  k=${cfg%:*}; s=${cfg#*:}
  echo "== keys $k per_sm $s: squeeze 2048 @ 8192"; SK_KEYS=$k SK_PER_SM=$s timeout 90 $B bench --device cuda --dummy $C -p 512 -n 64 -d 8192 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | grep -E "^\| tg"
done
for cfg in 64:4 32:4 128:4; do
  k=${cfg%:*}; s=${cfg#*:}
  echo "== keys $k per_sm $s: d0"; SK_KEYS=$k SK_PER_SM=$s timeout 60 $B bench --device cuda --dummy $C -p 512 -n 128 -d 0 -r 3 2>&1 | grep -E "^\| tg"
done
echo "($(( $(date +%s) - t0 )) s)"
