#!/usr/bin/env bash
# The library's static thread-local storage stays small. glibc carves a library's static TLS out of
# every thread's stack in the program that loads it, threads the library never sees among them: a
# 10 MB thread_local scratch (the recent ring's, 2026-12-06) overflowed the HTTP server's handler
# threads on their first request. Scratch that size lives on the heap, grown once per thread.
set -euo pipefail
lib="$1"
limit=$((64 * 1024))
hex="$(readelf -lW "$lib" | awk '$1 == "TLS" { print $6 }')"
size=$((${hex:-0}))
echo "static TLS of $(basename "$lib"): $size bytes (limit $limit)"
if [ "$size" -gt "$limit" ]; then
  echo "FAIL: static TLS over $limit bytes; the largest thread-local symbols:"
  readelf -sW "$lib" | awk '$4 == "TLS"' | sort -k3 -g | tail -5
  exit 1
fi
