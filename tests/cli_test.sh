#!/usr/bin/env bash
# The CLI end to end: a real generation prints text and a tokens/s line; every wrong input gives a
# clear message naming the input and a non-zero exit.
set -u
bin="$1"; shared="$2"
m="$shared/models/stories260k/stories260K.bin"; tok="$shared/models/stories260k/tok512.bin"
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# expect_error "what the message must contain" args...
expect_error() {
  local needle="$1"; shift
  local out rc
  out="$("$bin" "$@" 2>&1 < /dev/null)"; rc=$?
  if [ $rc -eq 0 ]; then bad "exit 0 for: $*"; return; fi
  if [ $rc -gt 128 ]; then bad "crashed (rc $rc) for: $*"; return; fi
  case "$out" in *"$needle"*) ok ;; *) bad "message for '$*' lacks '$needle': $out" ;; esac
}

out="$("$bin" generate -m "$m" --tokenizer "$tok" -p "Once upon a time" -n 20 --temp 0 -t 2 2>&1)"; rc=$?
[ $rc -eq 0 ] && ok || bad "generation failed: $out"
case "$out" in *"Once upon a time"*"tokens/s"*) ok ;; *) bad "no text or tokens/s line: $out" ;; esac

# chat: one message per line on stdin; a model without a template falls back to plain text
out="$(printf 'Once upon a time\n/reset\nThe dog\n' | "$bin" chat -m "$m" --tokenizer "$tok" -n 12 --temp 0 2>&1)"; rc=$?
[ $rc -eq 0 ] && ok || bad "chat failed: $out"
case "$out" in *"warning: chat: unknown or missing chat template"*) ok ;; *) bad "chat gave no template warning: $out" ;; esac
[ "$(printf '%s\n' "$out" | grep -vc warning)" -ge 2 ] && ok || bad "chat did not answer both messages: $out"

expect_error "does not exist" generate -m /nonexistent/model.gguf -p hi
expect_error "--tokenizer" generate -m "$m" --tokenizer /nonexistent/tok.bin -p hi
expect_error "neither a GGUF file" generate -m "$m" -p hi
expect_error "--temp" generate -m "$m" --tokenizer "$tok" -p hi --temp -1
expect_error "--top-p" generate -m "$m" --tokenizer "$tok" -p hi --top-p 0
expect_error "--min-p" generate -m "$m" --tokenizer "$tok" -p hi --min-p 2
expect_error "--kv-type" generate -m "$m" --tokenizer "$tok" -p hi --kv-type f8
expect_error "--kv-type-k: unknown value 'q2'" generate -m "$m" --tokenizer "$tok" -p hi --kv-type-k q2
expect_error "--kv-type-v: unknown value 'q9' (expected one of: f16, f32, q8_0, q4_0, q4_1)" generate -m "$m" --tokenizer "$tok" -p hi --kv-type-v q9
# 8- and 4-bit rows are blocks of 32 along the head dim: stories260K's head dim is 8
expect_error "--kv-type q8_0: blocks of 32 along the head dim need a head dim that is a multiple of 32 (the model's is 8)" generate -m "$m" --tokenizer "$tok" -p hi --kv-type q8_0
# the f16 copies of the newest rows: only beside quantized rows, at most 4096
expect_error "--kv-recent-f16: keeps quantized rows' newest tokens in f16; with --kv-type f16 there are none" generate -m "$m" --tokenizer "$tok" -p hi --kv-recent-f16 64
expect_error "--kv-recent-f16: expected 0 to 4096 rows, got 5000" generate -m "$m" --tokenizer "$tok" -p hi --kv-type-v q8_0 --kv-recent-f16 5000
expect_error "--kv-recent-f16: expected an integer, got 'many'" generate -m "$m" --tokenizer "$tok" -p hi --kv-recent-f16 many
expect_error "--decode-activations" generate -m "$m" --tokenizer "$tok" -p hi --decode-activations int4
expect_error "--kv-policy" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy lru
expect_error "--threads" generate -m "$m" --tokenizer "$tok" -p hi -t 0
expect_error "--device" generate -m "$m" --tokenizer "$tok" -p hi --device gpu
expect_error "--device-weights" generate -m "$m" --tokenizer "$tok" -p hi --device-weights fp8
expect_error "--cuda-graphs" generate -m "$m" --tokenizer "$tok" -p hi --cuda-graphs sometimes
expect_error "--batch-invariant" generate -m "$m" --tokenizer "$tok" -p hi --batch-invariant maybe
expect_error "--max-memory" generate -m "$m" --tokenizer "$tok" -p hi --max-memory lots
expect_error "--max-memory" generate -m "$m" --tokenizer "$tok" -p hi --max-memory 0
expect_error "--max-memory" generate -m "$m" --tokenizer "$tok" -p hi --max-memory 2K   # below the weights
expect_error "--max-memory" generate -m "$m" --tokenizer "$tok" -p hi --max-memory 1500K --ctx 4096  # a full cache beyond it
expect_error "--max-memory" bench --dummy "$(dirname "$0")/../bench/configs/llama-3.1-8b.json" --max-memory 1G  # refused before allocating 16 GB
expect_error "--kv-memory" generate -m "$m" --tokenizer "$tok" -p hi --kv-memory lots
expect_error "--kv-memory" generate -m "$m" --tokenizer "$tok" -p hi --kv-memory 0
expect_error "--kv-memory" generate -m "$m" --tokenizer "$tok" -p hi --kv-memory -0.5
expect_error "--kv-memory" generate -m "$m" --tokenizer "$tok" -p hi --kv-memory 100K --ctx 4096  # a full cache beyond the pool
out="$("$bin" generate -m "$m" --tokenizer "$tok" -p "Once upon a time" -n 8 --temp 0 -t 2 --kv-memory 0.5 2>&1)"; rc=$?
[ $rc -eq 0 ] && ok || bad "--kv-memory 0.5 (a share of the free memory) refused: $out"
# the CPU kernels' cap: a value it does not know refused, naming it; avx2 named by the bench
SQUEEZEKV_CPU=avx51 expect_error "SQUEEZEKV_CPU: expected native, avx512 or avx2, got 'avx51'" generate -m "$m" --tokenizer "$tok" -p hi
out="$(SQUEEZEKV_CPU=avx2 "$bin" bench -m "$m" --tokenizer "$tok" -t 1 -p 8 -n 2 -r 1 2>&1)"
case "$out" in *"kernels avx2)"*) ok ;; *) bad "bench under SQUEEZEKV_CPU=avx2 does not name its kernels avx2: $out" ;; esac
# the 16-bit decode rows' switch: a value other than 0 or 1 refused, naming it
SQUEEZEKV_CPU_HALF_ROWS=no expect_error "SQUEEZEKV_CPU_HALF_ROWS: expected 0 or 1, got 'no'" generate -m "$m" --tokenizer "$tok" -p hi
SQUEEZEKV_CPU_HALF_ROWS_AHEAD=4k expect_error "SQUEEZEKV_CPU_HALF_ROWS_AHEAD: expected bytes from 0 to 65536, got '4k'" generate -m "$m" --tokenizer "$tok" -p hi
# a build without the CUDA backend, or a machine without a GPU, says so (this test runs without one)
if ! command -v nvidia-smi >/dev/null 2>&1; then expect_error "cuda" generate -m "$m" --tokenizer "$tok" -p hi --device cuda; fi
# a build with the CUDA backend refuses a measurement switch's unknown value, naming it, before any device work
case "$("$bin" generate -m "$m" --tokenizer "$tok" -p hi --device cuda 2>&1 < /dev/null)" in
  *"has no CUDA backend"*) ;;
  *) SQUEEZEKV_CUDA_BATCH=bogus expect_error "SQUEEZEKV_CUDA_BATCH: expected tuned, blas, gemv or mma, got 'bogus'" \
       generate -m "$m" --tokenizer "$tok" -p hi --device cuda
     SQUEEZEKV_CUDA_ROWS_STEP=96 expect_error "SQUEEZEKV_CUDA_ROWS_STEP: expected 64 or 128, got 96" \
       generate -m "$m" --tokenizer "$tok" -p hi --device cuda
     SQUEEZEKV_CUDA_BATCH_SPLITS=some expect_error "SQUEEZEKV_CUDA_BATCH_SPLITS: expected lone or batch, got 'some'" \
       generate -m "$m" --tokenizer "$tok" -p hi --device cuda
     # KV row types the device does not store, the flag of the side it lacks named (head dim 32)
     sl="$(dirname "$0")/../bench/configs/small-llama.json"
     expect_error "--kv-type q4_1: the CUDA backend stores" generate --dummy "$sl" -p hi --device cuda --kv-type q4_1
     expect_error "--kv-type-v q4_0: the CUDA backend stores" generate --dummy "$sl" -p hi --device cuda --kv-type-v q4_0
     expect_error "--kv-type q8_0: the CUDA backend stores K and V as one type, f16, f32 or q8_0, or q4_1 values (--kv-type-v q4_1) beside f16 or q8_0 keys (q8_0 for head dims that are multiples of 64; this model's is 32)" \
       generate --dummy "$sl" -p hi --device cuda --kv-type q8_0 --kv-type-v q4_1
     expect_error "--kv-recent-f16 16: the CUDA kernels read each row as stored" generate --dummy "$sl" -p hi --device cuda --kv-type-v q4_1 --kv-recent-f16 16 ;;
esac
expect_error "--dummy" generate --dummy /nonexistent/config.json -p hi
expect_error "not both" generate --dummy /nonexistent/config.json -m "$m" -p hi
expect_error "--dummy-type: unknown preset 'Q3'" bench --dummy "$(dirname "$0")/../bench/configs/small-llama.json" --dummy-type Q3 -p 8 -n 1
expect_error "--dummy-type: only with --dummy" generate -m "$m" --tokenizer "$tok" -p hi --dummy-type Q4_K_M
expect_error "--max-memory" bench --dummy "$(dirname "$0")/../bench/configs/llama-3.1-70b.json" --dummy-type Q4_K_M --max-memory 1G  # 40.5 GiB of blocks, refused before allocating
big="$(mktemp --suffix=.json)"
printf '{"model_type": "llama", "hidden_size": 65536, "intermediate_size": 262144, "num_hidden_layers": 96,
 "num_attention_heads": 512, "num_key_value_heads": 64, "vocab_size": 128000}' > "$big"
expect_error "more than this machine's memory" generate --dummy "$big" -p hi
echo '{"model_type": "llama", "hidden_size": 64' > "$big"
expect_error "not valid JSON" generate --dummy "$big" -p hi
rm -f "$big"
expect_error "-n" generate -m "$m" --tokenizer "$tok" -p hi -n -5
expect_error "--ctx" generate -m "$m" --tokenizer "$tok" -p hi --ctx 0
expect_error "context full" generate -m "$m" --tokenizer "$tok" -p "Once upon a time there was" --ctx 4
expect_error "-f" generate -m "$m" --tokenizer "$tok" -f /nonexistent/prompt.txt
expect_error "--stop" generate -m "$m" --tokenizer "$tok" -p hi --stop ""
expect_error "unknown_flag" generate --unknown_flag
expect_error "subcommand" 

# KV flags: refused before any work, naming the flag
expect_error "--kv-budget" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy h2o
expect_error "--kv-budget" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy h2o --kv-budget 0
expect_error "--kv-recent" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy h2o --kv-budget 16 --kv-sinks 4 --kv-recent 12
expect_error "--kv-sinks" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy window --kv-budget 4 --kv-sinks 4
expect_error "--squeeze-strength" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy squeeze --kv-budget 64 --squeeze-strength 1.5
expect_error "--squeeze-metric" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy squeeze --kv-budget 64 --squeeze-metric loud
expect_error "--squeeze-alloc" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy squeeze --kv-budget 64 --squeeze-alloc magic
expect_error "--squeeze-p" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy squeeze --kv-budget 64 --squeeze-alloc kmeans3 --squeeze-p 0
expect_error "--kv-head-alloc" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy h2o --kv-budget 16 --kv-head-alloc sideways
expect_error "--kv-head-alloc" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy window --kv-budget 16 --kv-head-alloc adaptive
expect_error "--kv-layer-alloc" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy kvzip --kv-budget 16 --kv-layer-alloc sideways
expect_error "--kv-layer-alloc" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy h2o --kv-budget 16 --kv-layer-alloc squeeze
expect_error "--squeeze-cap" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy squeeze --kv-budget 64 --squeeze-cap maybe
expect_error "--squeeze-resolve" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy squeeze --kv-budget 64 --squeeze-resolve later
expect_error "--kv-budget" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy kvzip
expect_error "--snapkv-window" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy snapkv --kv-budget 16 --snapkv-window 16
expect_error "--snapkv-window" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy squeeze --kv-budget 16 --snapkv-window 0
expect_error "--kv-stats-json" generate -m "$m" --tokenizer "$tok" -p hi -n 2 --kv-stats-json /nonexistent/dir/x.json
# a bad flag is refused before the model is even read
expect_error "--kv-policy" generate -m /nonexistent/model.gguf -p hi --kv-policy lru

# eval: bad inputs fail before any model work (the model path does not even exist here)
expect_error "--text" eval ppl -m /nonexistent/model.gguf --text /nonexistent/text.txt --ctx 64 --prefix 32
expect_error "--prefix" eval ppl -m /nonexistent/model.gguf --text "$shared/data/austen/emma.txt" --ctx 64 --prefix 64
expect_error "--depths" eval retrieval -m /nonexistent/model.gguf --task passkey --depths 0.5,1.2
expect_error "--task" eval retrieval -m /nonexistent/model.gguf --task soup
expect_error "--config" eval sweep --config /nonexistent/sweep.json
expect_error "--windows" eval ppl -m /nonexistent/model.gguf --text "$shared/data/austen/emma.txt" --ctx 64 --prefix 32 --windows 0
expect_error "--samples" eval retrieval -m /nonexistent/model.gguf --task passkey --samples 0
expect_error "--haystack" eval retrieval -m /nonexistent/model.gguf --task passkey --haystack /nonexistent/hay.txt
expect_error "--answer-tokens" eval retrieval -m /nonexistent/model.gguf --task passkey --answer-tokens 0
expect_error "--reuse" eval retrieval -m /nonexistent/model.gguf --task passkey --reuse --question-aware
expect_error "--pyramid-beta" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy pyramidkv --kv-budget 64 --pyramid-beta 0.5
expect_error "--top-k" generate -m "$m" --tokenizer "$tok" -p hi --top-k -1
expect_error "--prefill-chunk" generate -m "$m" --tokenizer "$tok" -p hi --prefill-chunk 0
expect_error "cannot hold" eval retrieval -m "$m" --tokenizer "$tok" --task niah-multivalue --ctx 128 --depths 0.5
out="$("$bin" eval ppl -m "$m" --tokenizer "$tok" --text "$shared/data/austen/emma.txt" --ctx 64 --prefix 32 --windows 2 \
       --kv-policy h2o --kv-budget 16 2>/dev/null)"; rc=$?
[ $rc -eq 0 ] && ok || bad "eval ppl failed"
case "$(echo "$out" | tail -n 1)" in ppl=*" windows=2 tokens=64 kept_bytes="*" full_bytes="*) ok ;; *) bad "eval ppl summary line: $out" ;; esac

# --kv-stats prints the table; --kv-stats-json writes the documented record
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
out="$("$bin" generate -m "$m" --tokenizer "$tok" -p "Once upon a time, there was a little girl" -n 40 --temp 0 \
       --kv-policy squeeze --kv-budget 16 --kv-stats --kv-stats-json "$tmp/kv.json" 2>&1)"; rc=$?
[ $rc -eq 0 ] && ok || bad "squeeze generation failed: $out"
case "$out" in *"tokens_seen"*"compression_ratio"*) ok ;; *) bad "no --kv-stats table: $out" ;; esac
if python3 - "$tmp/kv.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
keys = {"layer", "tokens_seen", "tokens_kept", "budget", "concentration", "kept_bytes", "full_bytes"}
assert len(d["layers"]) == 5, d
assert all(keys <= set(l) for l in d["layers"]), d
assert d["total_kept_bytes"] == sum(l["kept_bytes"] for l in d["layers"])
assert d["total_full_bytes"] == sum(l["full_bytes"] for l in d["layers"])
assert sum(l["budget"] for l in d["layers"]) == 5 * 16
assert all(l["tokens_kept"] <= l["budget"] for l in d["layers"])
PY
then ok; else bad "kv stats json malformed"; fi

# bench: the JSON holds one record per test; the KV bytes follow from the model's shape (stories260K:
# 5 layers, 4 kv heads of 8 dims, f16: 640 bytes a token), and a budget holds the cache to it
bj="$(mktemp)"
out="$("$bin" bench -m "$m" --tokenizer "$tok" -p 24 -n 8 -d 0,40 -r 2 -t 2 --json "$bj" 2>&1)"; rc=$?
[ $rc -eq 0 ] && ok || bad "bench failed: $out"
case "$out" in *"read bandwidth "*" GB/s (measured, cpu, 2 threads)"*"| pp24 @ d40 |"*"| tg8 @ d40 |"*"peak RSS"*) ok ;; *) bad "bench table incomplete: $out" ;; esac
if python3 - "$bj" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
t = {(x["test"], x["depth"]): x for x in d["tests"]}
assert set(t) == {("pp", 0), ("tg", 0), ("pp", 40), ("tg", 40)}, t
# the host's read bandwidth, and each decode test's share of what it bounds: matrices + held KV
# read a step at that bandwidth (a GPU's run reports its copy bandwidth instead)
assert "copy_bandwidth_bytes_s" not in d, d
bw = d["read_bandwidth_bytes_s"]
assert 1e8 < bw < 1e13, bw
for k in (("tg", 0), ("tg", 40)):
    x = t[k]
    assert abs(x["roofline_fraction"] - x["median"] * (d["device_matrix_bytes"] + x["kv_kept_bytes"]) / bw) < 1e-6 * max(1.0, x["roofline_fraction"]), x
assert all(len(x["tok_s"]) == 2 and min(x["tok_s"]) > 0 for x in t.values())
assert all(min(x["tok_s"]) <= x["median"] <= max(x["tok_s"]) for x in t.values())
assert t[("pp", 40)]["kv_full_bytes"] == (40 + 24) * 640 == t[("pp", 40)]["kv_kept_bytes"], t[("pp", 40)]
assert t[("tg", 0)]["kv_kept_bytes"] == 8 * 640
assert d["threads"] == 2 and d["kv_policy"] == "full" and d["matrix_bytes"] > 0
PY
then ok; else bad "bench json wrong"; fi
out="$("$bin" bench -m "$m" --tokenizer "$tok" -p 16 -n 4 -d 64 -r 1 -t 2 --kv-policy h2o --kv-budget 16 --prefill-chunk 16 --json "$bj" 2>&1)"; rc=$?
[ $rc -eq 0 ] && ok || bad "bench with a budget failed: $out"
python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
assert all(x['kv_kept_bytes'] <= 16 * 640 < x['kv_full_bytes'] for x in d['tests']), d['tests']
" "$bj" && ok || bad "bench with a budget held more than it"
# -b: B sequences prefill and decode together (the Engine); the KV held is B times one
# sequence's, the aggregate counts every sequence's tokens, and a budget holds each sequence
out="$("$bin" bench -m "$m" --tokenizer "$tok" -p 12 -n 6 -d 20 -b 1,3 -r 2 -t 2 --kv-policy h2o --kv-budget 16 --prefill-chunk 8 --json "$bj" 2>&1)"; rc=$?
[ $rc -eq 0 ] && ok || bad "bench -b failed: $out"
case "$out" in *"| pp12 @ d20 |"*"| tg6 @ d20 |"*"| pp12 @ d20 x3 |"*"| tg6 @ d20 x3 |"*) ok ;; *) bad "bench -b table incomplete: $out" ;; esac
python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
t = {(x['test'], x['batch']): x for x in d['tests']}
assert set(t) == {('pp', 1), ('pp', 3), ('tg', 1), ('tg', 3)}, d['tests']
assert all(min(x['tok_s']) > 0 for x in t.values()) and all(t[('tg', b)]['step_ms'] > 0 for b in (1, 3)), d['tests']
for kind, n in (('pp', 12), ('tg', 6)):
    assert t[(kind, 3)]['kv_kept_bytes'] == 3 * t[(kind, 1)]['kv_kept_bytes'] == 3 * 16 * 640, (kind, t)
    assert t[(kind, 3)]['kv_full_bytes'] == 3 * (20 + n) * 640, (kind, t)
" "$bj" && ok || bad "bench -b json wrong"
# -t LIST: every test at each thread count in turn, a table and a JSON line each
out="$("$bin" bench -m "$m" --tokenizer "$tok" -p 8 -n 4 -r 1 -t 1,2 --json "$bj" 2>&1)"; rc=$?
[ $rc -eq 0 ] && ok || bad "bench -t 1,2 failed: $out"
case "$out" in *"cpu, 1 threads"*"| tg4 @ d0 |"*"cpu, 2 threads"*"| tg4 @ d0 |"*) ok ;; *) bad "bench -t 1,2: not a table a thread count: $out" ;; esac
python3 -c "
import json, sys
d = [json.loads(line) for line in open(sys.argv[1])]
assert [x['threads'] for x in d] == [1, 2], d
assert all({(t['test'], t['tokens']) for t in x['tests']} == {('pp', 8), ('tg', 4)} for x in d), d
" "$bj" && ok || bad "bench -t 1,2 json wrong"
rm -f "$bj"
expect_error "--threads" bench -m "$m" --tokenizer "$tok" -t 2,0
expect_error "-b" bench -m "$m" --tokenizer "$tok" -b 0
expect_error "-r" bench -m "$m" --tokenizer "$tok" -r 0
expect_error "-p" bench -m "$m" --tokenizer "$tok" -p -5
expect_error "-d" bench -m "$m" --tokenizer "$tok" -d 10,-1
expect_error "nothing to measure" bench -m "$m" --tokenizer "$tok" -p 0 -n 0
expect_error "--ctx" bench -m "$m" --tokenizer "$tok" -p 64 -n 8 -d 100 --ctx 128
expect_error "--kv-budget" bench -m "$m" --tokenizer "$tok" --kv-policy h2o
expect_error "--json" bench -m "$m" --tokenizer "$tok" -p 8 -n 2 -r 1 --json /nonexistent/dir/b.json
expect_error "--kv-stats" bench -m "$m" --tokenizer "$tok" -p 8 -n 2 -r 1 --kv-stats

# saved KV caches (docs/kv_file.md): a document's cache saved, then loaded under a longer prompt,
# gives what the whole prompt gives cold (full cache: the int8 decode products are chunking-
# invariant); a kvzip cache loads and answers; mismatches and damage are refused naming them
kvdir="$(mktemp -d)"
doc="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends."
q=" One day, Lily saw a big"
"$bin" generate -m "$m" --tokenizer "$tok" -p "$doc" -n 0 -t 2 --save-kv "$kvdir/full.kv" > /dev/null 2>&1 && ok || bad "--save-kv failed"
cold="$("$bin" generate -m "$m" --tokenizer "$tok" -p "$doc$q" -n 16 --temp 0 -t 2 2>/dev/null)"
warm="$("$bin" generate -m "$m" --tokenizer "$tok" -p "$doc$q" -n 16 --temp 0 -t 2 --load-kv "$kvdir/full.kv" 2>"$kvdir/err")"
[ -n "$cold" ] && [ "$cold" = "$warm" ] && ok || bad "--load-kv: '$warm' differs from the cold run's '$cold'"
grep -q "load-kv: [0-9]* cached tokens" "$kvdir/err" && ok || bad "--load-kv: no cached-token line: $(cat "$kvdir/err")"
"$bin" generate -m "$m" --tokenizer "$tok" -p "$doc" -n 0 -t 2 --kv-policy kvzip --kv-budget 12 --save-kv "$kvdir/zip.kv" > /dev/null 2>&1 && ok || bad "kvzip --save-kv failed"
"$bin" generate -m "$m" --tokenizer "$tok" -p "$doc$q" -n 8 --temp 0 -t 2 --kv-policy kvzip --kv-budget 12 --load-kv "$kvdir/zip.kv" > /dev/null 2>&1 && ok || bad "kvzip --load-kv failed"
"$bin" generate -m "$m" --tokenizer "$tok" -p "$doc" -n 6 --temp 0 -t 2 --kv-policy h2o --kv-budget 16 --save-kv "$kvdir/after.kv" --save-kv-after 2>&1 | grep -q "save-kv: " && ok || bad "--save-kv-after wrote nothing"
expect_error "--kv-budget: the cache was saved with 12, this run asks 16" generate -m "$m" --tokenizer "$tok" -p "$doc$q" --kv-policy kvzip --kv-budget 16 --load-kv "$kvdir/zip.kv"
expect_error "the prompt differs from the" generate -m "$m" --tokenizer "$tok" -p "A different story$q" --load-kv "$kvdir/full.kv"
expect_error "the prompt adds nothing" generate -m "$m" --tokenizer "$tok" -p "$doc" --load-kv "$kvdir/full.kv"
expect_error "cannot be read" generate -m "$m" --tokenizer "$tok" -p "$doc$q" --load-kv "$kvdir/none.kv"
head -c 200 "$kvdir/full.kv" > "$kvdir/cut.kv"
expect_error "kv cache '$kvdir/cut.kv'" generate -m "$m" --tokenizer "$tok" -p "$doc$q" --load-kv "$kvdir/cut.kv"
printf 'GGUF but not a cache' > "$kvdir/magic.kv"
expect_error "no SQKV magic" generate -m "$m" --tokenizer "$tok" -p "$doc$q" --load-kv "$kvdir/magic.kv"
expect_error "saved for another model" generate -m "$shared/models/tinystories-656k" -p "$doc$q" --load-kv "$kvdir/full.kv"
expect_error "--kv-policy custom: needs a scoring function" generate -m "$m" --tokenizer "$tok" -p "$doc" --kv-policy custom --kv-budget 8
expect_error "--save-kv: cannot write" generate -m "$m" --tokenizer "$tok" -p "$doc" --save-kv /nonexistent/dir/x.kv
rm -rf "$kvdir"

# serve: wrong flags are refused before it listens
expect_error "--parallel" serve -m "$m" --tokenizer "$tok" --port 0 --parallel 0
expect_error "--queue" serve -m "$m" --tokenizer "$tok" --port 0 --queue -1
expect_error "--port" serve -m "$m" --tokenizer "$tok" --port 70000
expect_error "--max-prompt-tokens" serve -m "$m" --tokenizer "$tok" --port 0 --max-prompt-tokens -5
expect_error "--kv-budget" serve -m "$m" --tokenizer "$tok" --port 0 --kv-policy h2o
expect_error "--kv-budget" serve -m "$m" --tokenizer "$tok" --port 0 --kv-policy h2o --kv-budget lots
expect_error "--kv-stats" serve -m "$m" --tokenizer "$tok" --port 0 --kv-stats
expect_error "--prompt-cache" serve -m "$m" --tokenizer "$tok" --port 0 --prompt-cache lots
expect_error "--prompt-cache" serve -m "$m" --tokenizer "$tok" --port 0 --prompt-cache -1G

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
