#!/usr/bin/env bash
# 2026-11-30, commit 3d240b4 run 9: the squeeze target's figure with builds alternated in one call: t (run 7's
# final build) vs u (+ the deferred mass), squeeze 2048 at 32768 twice each; then full 32768 (u).
set -u
B=out/dev/squeezekv
C=bench/configs/llama-3.1-8b.json
t0=$(date +%s)
lib() { echo $PWD/out/dev/$1/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64; }
for round in 1 2; do
  for v in t u; do echo "== round $round squeeze 2048 @ 32768 $v"; LD_LIBRARY_PATH=$(lib $v) timeout 150 $B bench --device cuda --dummy $C -p 512 -n 64 -d 32768 -r 2 --kv-policy squeeze --kv-budget 2048 2>&1 | grep -E "^\| tg"; done
done
echo "== full 32768 u"; LD_LIBRARY_PATH=$(lib u) timeout 120 $B bench --device cuda --dummy $C -p 512 -n 64 -d 32768 -r 2 2>&1 | grep -E "^\| tg"
echo "($(( $(date +%s) - t0 )) s)"
