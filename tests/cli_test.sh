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

expect_error "does not exist" generate -m /nonexistent/model.gguf -p hi
expect_error "--tokenizer" generate -m "$m" --tokenizer /nonexistent/tok.bin -p hi
expect_error "neither a GGUF file" generate -m "$m" -p hi
expect_error "--temp" generate -m "$m" --tokenizer "$tok" -p hi --temp -1
expect_error "--top-p" generate -m "$m" --tokenizer "$tok" -p hi --top-p 0
expect_error "--min-p" generate -m "$m" --tokenizer "$tok" -p hi --min-p 2
expect_error "--kv-type" generate -m "$m" --tokenizer "$tok" -p hi --kv-type f8
expect_error "--kv-policy" generate -m "$m" --tokenizer "$tok" -p hi --kv-policy lru
expect_error "--threads" generate -m "$m" --tokenizer "$tok" -p hi -t 0
expect_error "-n" generate -m "$m" --tokenizer "$tok" -p hi -n -5
expect_error "--ctx" generate -m "$m" --tokenizer "$tok" -p hi --ctx 0
expect_error "context full" generate -m "$m" --tokenizer "$tok" -p "Once upon a time there was" --ctx 4
expect_error "-f" generate -m "$m" --tokenizer "$tok" -f /nonexistent/prompt.txt
expect_error "--stop" generate -m "$m" --tokenizer "$tok" -p hi --stop ""
expect_error "unknown_flag" generate --unknown_flag
expect_error "subcommand" 

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
