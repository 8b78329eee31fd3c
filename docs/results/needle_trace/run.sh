#!/usr/bin/env bash
# Where the pass key's tokens go in real text (issue 31): Emma haystacks, 2048 tokens, 20% KV (410
# rows a layer), the sweeps' depths and seed (bench/sweep_smollm2_kvzip_heads.json's passkey-emma),
# each policy's needle trace (`eval retrieval --trace-needles`). Run from the repository root.
set -eu
m=models/SmolLM2-135M-Instruct.Q4_1.gguf
out=docs/results/needle_trace
run() {  # label, then the policy's flags
  local label=$1; shift
  ./build/squeezekv eval retrieval -m $m --task passkey --ctx 2048 --depths 0.1,0.3,0.5,0.7,0.9 --samples 2 --seed 7 \
    --haystack ../shared/data/austen/emma.txt --kv-budget 410 -t 2 --trace-needles "$@" > $out/$label.txt 2> $out/$label.err
  grep -v "^retrieval" $out/$label.err > $out/$label.samples.txt || true; rm -f $out/$label.err
}
run kvzip-adaptive --kv-policy kvzip --kv-head-alloc adaptive --json $out/kvzip-adaptive.json
run kvzip --kv-policy kvzip
run h2o --kv-policy h2o
run snapkv --kv-policy snapkv
run squeeze --kv-policy squeeze
python3 $out/table.py > $out/table.md
