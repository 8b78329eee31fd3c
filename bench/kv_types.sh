#!/usr/bin/env bash
# Quantized KV rows on the CPU (issue 27): perplexity and decode speed of each row type beside f16,
# with the full cache and with squeeze at 10%, on SmolLM2 (the default model), 2 threads.
#   quality: `squeezekv eval ppl`, 4 windows of 4096 tokens (2048 prefilled, 2048 scored), Emma
#            (../shared/data/austen) and Genesis (scripts/make-long-text data/kjv-genesis.txt
#            Genesis1:1-50:26); squeeze --kv-budget 410 (10% of 4096)
#   speed:   `squeezekv bench -p 0 -n 64 -d 8192 -r 3`, full and squeeze 512, the types alternated
# Usage: bench/kv_types.sh OUT_DIR [TYPES...]   (default types: f16 q8_0 q4_0 q4_1)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: bench/kv_types.sh OUT_DIR [TYPES...]}"; shift
types=("${@:-f16 q8_0 q4_0 q4_1}")
[ $# -eq 0 ] && types=(f16 q8_0 q4_0 q4_1)
bin="$root/build/squeezekv"; m="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$out"
for text in "$root/../shared/data/austen/emma.txt" "$root/data/kjv-genesis.txt"; do
  name="$(basename "$text" .txt)"
  for t in "${types[@]}"; do
    for p in full squeeze; do
      extra=(); [ "$p" = squeeze ] && extra=(--kv-policy squeeze --kv-budget 410)
      "$bin" eval ppl -m "$m" --text "$text" --ctx 4096 --prefix 2048 --windows 4 -t 2 --kv-type "$t" "${extra[@]}" \
        --json "$out/ppl-$name-$p-$t.json" > /dev/null
    done
  done
done
for round in 1 2; do
  for t in "${types[@]}"; do
    "$bin" bench -m "$m" -p 0 -n 64 -d 8192 -r 3 -t 2 --kv-type "$t" 2>&1 | grep -E '^\| tg' | sed "s/^/$t full r$round /" >> "$out/bench.txt"
    "$bin" bench -m "$m" -p 0 -n 64 -d 8192 -r 3 -t 2 --kv-type "$t" --kv-policy squeeze --kv-budget 512 2>&1 | grep -E '^\| tg' |
      sed "s/^/$t squeeze512 r$round /" >> "$out/bench.txt"
  done
done
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = {}
for f in sorted(out.glob("ppl-*.json")):
    r = json.loads(f.read_text())
    _, text, policy, t = f.stem.split("-", 3)
    rows[(text, policy, t)] = r
print("| text | policy | type | perplexity | vs f16 | kept bytes |")
print("|---|---|---|---:|---:|---:|")
for (text, policy, t), r in sorted(rows.items()):
    base = rows.get((text, policy, "f16"))
    ppl = r.get("perplexity", r.get("ppl"))
    rel = f"{ppl / base.get('perplexity', base.get('ppl')) - 1:+.2%}" if base else ""
    print(f"| {text} | {policy} | {t} | {ppl:.3f} | {rel} | {r.get('kept_bytes', '')} |")
PY
