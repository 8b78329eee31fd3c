#!/usr/bin/env bash
# cmake --install, then build and run a program outside the repo against the installed package.
set -euo pipefail
build="$1"; src="$2"; shared="$3"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/tests/consumer" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
out="$("$tmp/build/consumer" "$shared/models/stories260k/stories260K.bin" "$shared/models/stories260k/tok512.bin")"
echo "consumer printed: $out"
case "$out" in *", there was a"*) echo "1 passed, 0 failed" ;; *) echo "0 passed, 1 failed"; exit 1 ;; esac
