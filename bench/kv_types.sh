#!/usr/bin/env bash
# Quantized KV rows on the CPU (issue 27): perplexity and decode speed of each row type beside f16,
# on SmolLM2 (the default model), 2 threads. A type is K's and V's, or K/V ("q8_0/q4_1": q8_0 keys,
# q4_1 values).
#   quality: `squeezekv eval ppl`, 4 windows of 4096 tokens (2048 prefilled, 2048 scored): Emma
#            (../shared/data/austen) with the full cache and with squeeze --kv-budget 410 (10%),
#            Genesis (scripts/make-long-text data/kjv-genesis.txt Genesis1:1-50:26) with the full
#            cache; a record already in OUT_DIR is kept (the runs resume)
#   speed:   `squeezekv bench -p 0 -n 64 -d 8192 -r 3`, full and squeeze 512, the types alternated,
#            two rounds
# A type may end in +rN: the newest N rows also kept in f16 (--kv-recent-f16 N; "q4_1+r128").
# Usage: bench/kv_types.sh OUT_DIR [TYPE...]   (default: f16 q8_0 q4_0 q4_1 q8_0/q4_1 q4_1+r128)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: bench/kv_types.sh OUT_DIR [TYPE...]}"; shift
types=(f16 q8_0 q4_0 q4_1 q8_0/q4_1 q4_1+r128)
[ $# -gt 0 ] && types=("$@")
bin="$root/build/squeezekv"; m="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$out"
flags() {  # "q8_0" -> both q8_0; "q4_1+r128" -> both q4_1, the newest 128 rows also in f16
  local t="${1%+r*}" r=0
  [ "$t" != "$1" ] && r="${1##*+r}"
  echo "--kv-type-k ${t%/*} --kv-type-v ${t#*/} --kv-recent-f16 $r"
}
tag() { local t="${1/\//_v}"; echo "${t/+/_}"; }               # "q8_0/q4_1" -> "q8_0_vq4_1", "q4_1+r128" -> "q4_1_r128"
ppl() {  # text policy type
  local name; name="$(basename "$1" .txt)"
  local json="$out/ppl-$name-$2-$(tag "$3").json"
  [ -s "$json" ] && return 0
  local extra=(); [ "$2" = squeeze ] && extra=(--kv-policy squeeze --kv-budget 410)
  # shellcheck disable=SC2046
  "$bin" eval ppl -m "$m" --text "$1" --ctx 4096 --prefix 2048 --windows 4 -t 2 $(flags "$3") "${extra[@]}" --json "$json" > /dev/null
}
for t in "${types[@]}"; do ppl "$root/../shared/data/austen/emma.txt" full "$t"; ppl "$root/../shared/data/austen/emma.txt" squeeze "$t"; done
for t in "${types[@]}"; do ppl "$root/data/kjv-genesis.txt" full "$t"; done
: > "$out/bench.txt"
for round in 1 2; do
  for t in "${types[@]}"; do
    # shellcheck disable=SC2046
    "$bin" bench -m "$m" -p 0 -n 64 -d 8192 -r 3 -t 2 $(flags "$t") 2>&1 | grep -E '^\| tg' | sed "s#^#$t full r$round #" >> "$out/bench.txt"
    # shellcheck disable=SC2046
    "$bin" bench -m "$m" -p 0 -n 64 -d 8192 -r 3 -t 2 $(flags "$t") --kv-policy squeeze --kv-budget 512 2>&1 | grep -E '^\| tg' |
      sed "s#^#$t squeeze512 r$round #" >> "$out/bench.txt"
  done
done
python3 - "$out" <<'PY'
import json, pathlib, re, sys
out = pathlib.Path(sys.argv[1])
rows = {}
for f in sorted(out.glob("ppl-*.json")):
    r = json.loads(f.read_text())
    text, policy = re.match(r"ppl-(.+)-(full|squeeze)-", f.name).groups()
    t = r["kv_type"] if r["kv_type"] == r["kv_type_v"] else r["kv_type"] + "/" + r["kv_type_v"]
    if r.get("kv_recent_f16"):
        t += f"+r{r['kv_recent_f16']}"
    rows[(text, policy, t)] = r
print("| text | policy | K/V type | perplexity | vs f16 | kept bytes | windows |")
print("|---|---|---|---:|---:|---:|---|")
for (text, policy, t), r in sorted(rows.items()):
    base = rows.get((text, policy, "f16"))
    rel = f"{r['ppl'] / base['ppl'] - 1:+.2%}" if base else ""
    win = ", ".join(f"{w:.2f}" for w in r["window_ppl"])
    print(f"| {text} | {policy} | {t} | {r['ppl']:.3f} | {rel} | {r['kept_bytes']:,} | {win} |")
PY
