#!/usr/bin/env bash
# squeezekv and llama.cpp on the CPU at several thread counts, side by side (issue 32): for each
# round, each thread count and each GGUF file, `squeezekv bench` and then `llama-bench`, one
# repetition each (the engines alternate, so a machine's drift falls on both), prompt P and
# decode N at depth D, every result a JSON file in OUT; bench/cpu_threads_report.py makes the
# table (medians over the rounds).
#   bench/cpu_threads.sh OUT SQUEEZEKV LLAMA_BENCH "1 2 4 8 16" ROUNDS FILE...
# Environment: P (512), N (128), TIMEOUT (300 s a run), D (0: both engines start each test from an empty cache; above 0
# the decode alone, after a prompt of D tokens), FIRST_ROUND (1: the first round's number, so that
# rounds run by separate calls land in one OUT).
# llama.cpp is a measuring instrument built by the caller (from the llama-cpp-python sdist, as
# bench/compare_llamacpp.py says); nothing of it is kept.
set -u
out=$1 sq=$2 lb=$3 threads=$4 rounds=$5
shift 5
P=${P:-512} N=${N:-128} D=${D:-0}
mkdir -p "$out"
first=${FIRST_ROUND:-1}
for r in $(seq "$first" $((first + rounds - 1))); do
  for t in $threads; do
    for f in "$@"; do
      tag="$(basename "$f" .gguf)_t${t}_d${D}_r${r}"
      if [ "$D" = 0 ]; then
        timeout "${TIMEOUT:-300}" "$sq" bench -m "$f" -t "$t" -p "$P" -n "$N" -r 1 --json "$out/sq_$tag.json" > /dev/null 2> "$out/sq_$tag.err" || echo "squeezekv failed: $tag"
        timeout "${TIMEOUT:-300}" "$lb" -m "$f" -t "$t" -p "$P" -n "$N" -r 1 -o json > "$out/ll_$tag.json" 2> "$out/ll_$tag.err" || echo "llama-bench failed: $tag"
      else
        timeout "${TIMEOUT:-300}" "$sq" bench -m "$f" -t "$t" -p 0 -n "$N" -d "$D" -r 1 --json "$out/sq_$tag.json" > /dev/null 2> "$out/sq_$tag.err" || echo "squeezekv failed: $tag"
        timeout "${TIMEOUT:-300}" "$lb" -m "$f" -t "$t" -p 0 -n "$N" -d "$D" -r 1 -o json > "$out/ll_$tag.json" 2> "$out/ll_$tag.err" || echo "llama-bench failed: $tag"
      fi
    done
  done
done
