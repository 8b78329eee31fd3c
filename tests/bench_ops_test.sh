#!/usr/bin/env bash
# squeezekv_bench_ops on the CPU at a small shape: one row per op (the decode products at 1 and 4
# rows, a decode batch of 4 sequences' attention with and without mass), each with a positive time and bandwidth; the
# attention rows over q8_0 and q4_1 rows (--kv-type), q4_1 rows with a recent f16 ring (--kv-recent-f16) and the
# products with 8-bit activations (--decode-activations int8) and over Q8_0 matrices (--weights), likewise; a wrong
# flag, value or config is refused naming it (a block type whose blocks do not fit the shape too).
set -euo pipefail
bin="$1"; src="$2"
pass=0; fail=0
out="$("$bin" --config "$src/bench/configs/small-llama.json" --depths 512 --chunk 64 --rounds 1 -t 2)"
echo "$out"
rows="$(grep -cE '^\| (gemv|gemm|rmsnorm|add\+rmsnorm|rope|silu_mul|attn|kv_)' <<<"$out" || true)"
bad="$(awk -F'|' '/^\| (gemv|gemm|rms|add|rope|silu|attn|kv_)/ { if (!($4 + 0 > 0) || !($6 + 0 > 0)) print }' <<<"$out")"
if [ "$rows" -eq 39 ] && [ -z "$bad" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $rows op rows (expected 39); rows without a time or bandwidth: $bad"; fi
for t in q8_0 q4_1; do
  out="$("$bin" --config "$src/bench/configs/small-llama.json" --depths 512 --chunk 64 --rounds 1 -t 2 --kv-type $t --filter attn)"
  rows="$(grep -cE '^\| attn' <<<"$out" || true)"
  bad="$(awk -F'|' '/^\| attn/ { if (!($4 + 0 > 0) || !($6 + 0 > 0)) print }' <<<"$out")"
  if [ "$rows" -eq 6 ] && [ -z "$bad" ] && grep -q "$t KV" <<<"$out"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: --kv-type $t: $rows attention rows (expected 6): $out"; fi
done
out="$("$bin" --config "$src/bench/configs/small-llama.json" --depths 512 --chunk 64 --rounds 1 -t 2 --kv-type q4_1 --kv-recent-f16 32 --filter attn)"
rows="$(grep -cE '^\| attn' <<<"$out" || true)"
if [ "$rows" -eq 6 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: --kv-recent-f16 32: $rows attention rows (expected 6): $out"; fi
out="$("$bin" --config "$src/bench/configs/small-llama.json" --depths 512 --chunk 64 --rounds 1 -t 2 --decode-activations int8 --filter gem)"
rows="$(grep -cE '^\| gem' <<<"$out" || true)"
bad="$(awk -F'|' '/^\| gem/ { if (!($4 + 0 > 0) || !($6 + 0 > 0)) print }' <<<"$out")"
if [ "$rows" -gt 0 ] && [ -z "$bad" ] && grep -q "int8 activations" <<<"$out"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: --decode-activations int8: $out"; fi
out="$("$bin" --config "$src/bench/configs/small-llama.json" --depths 512 --chunk 64 --rounds 1 -t 2 --decode-activations int8 --weights Q8_0 --filter gem)"
rows="$(grep -cE '^\| gem' <<<"$out" || true)"
bad="$(awk -F'|' '/^\| gem/ { if (!($4 + 0 > 0) || !($6 + 0 > 0)) print }' <<<"$out")"
if [ "$rows" -gt 0 ] && [ -z "$bad" ] && grep -q "Q8_0 weights" <<<"$out"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: --weights Q8_0: $out"; fi
if err="$("$bin" --weights F32 2>&1)"; then fail=$((fail + 1)); echo "FAILED: --weights F32 accepted"
elif grep -q -- "--weights: expected one of BF16, Q8_0, Q4_0" <<<"$err"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $err"; fi
if err="$("$bin" --config "$src/bench/configs/smollm2-135m.json" --weights Q4_K 2>&1)"; then fail=$((fail + 1)); echo "FAILED: --weights Q4_K over 576 columns accepted"
elif grep -q -- "--weights Q4_K: a matrix of 576 columns is not whole blocks of 256" <<<"$err"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $err"; fi
if err="$("$bin" --decode-activations int4 2>&1)"; then fail=$((fail + 1)); echo "FAILED: --decode-activations int4 accepted"
elif grep -q -- "--decode-activations: unknown value 'int4'" <<<"$err"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $err"; fi
if err="$("$bin" --kv-recent-f16 8 2>&1)"; then fail=$((fail + 1)); echo "FAILED: --kv-recent-f16 over f16 rows accepted"
elif grep -q -- '--kv-recent-f16: expected at most 4096 rows, with --device cpu and a quantized --kv-type, got 8' <<<"$err"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $err"; fi
if err="$("$bin" --kv-type q5_0 2>&1)"; then fail=$((fail + 1)); echo "FAILED: --kv-type q5_0 accepted"
elif grep -q -- "--kv-type: unknown value 'q5_0' (expected one of: f16, f32, q8_0, q4_0, q4_1)" <<<"$err"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $err"; fi
if err="$("$bin" --depths 0 2>&1)"; then fail=$((fail + 1)); echo "FAILED: --depths 0 accepted"
elif grep -q -- '--depths: expected positive integers' <<<"$err"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $err"; fi
if err="$("$bin" --batch 1,600 --chunk 512 2>&1)"; then fail=$((fail + 1)); echo "FAILED: --batch 600 over --chunk 512 accepted"
elif grep -q -- '--batch: 600 rows exceed --chunk 512' <<<"$err"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $err"; fi
if err="$("$bin" --batch 0 2>&1)"; then fail=$((fail + 1)); echo "FAILED: --batch 0 accepted"
elif grep -q -- '--batch: expected positive integers' <<<"$err"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $err"; fi
if err="$("$bin" --config /nonexistent.json 2>&1)"; then fail=$((fail + 1)); echo "FAILED: a missing config accepted"
elif grep -q 'nonexistent.json' <<<"$err"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $err"; fi
if err="$("$bin" --frobnicate 2>&1)"; then fail=$((fail + 1)); echo "FAILED: an unknown flag accepted"
elif grep -q "unknown argument '--frobnicate'" <<<"$err"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $err"; fi
if err="$("$bin" --device tpu 2>&1)"; then fail=$((fail + 1)); echo "FAILED: --device tpu accepted"
elif grep -q -- '--device: expected cpu or cuda' <<<"$err"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $err"; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
