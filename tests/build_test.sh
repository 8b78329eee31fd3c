#!/usr/bin/env bash
# The build as people type it: `cmake -S . -B DIR` with CMake's default generator (Unix Makefiles
# here, not Ninja) configures with and without the CUDA toolkit, and where nvcc is installed the
# CUDA backend's files compile with it (two of them: they share their flags; they once stopped
# configure: "requires the language dialect CUDA20"). The release build itself (Ninja,
# scripts/test) is the build of every other test.
set -euo pipefail
src="$1"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
unset CMAKE_GENERATOR
pass=0; fail=0
check() {  # name, command...
  local name="$1"; shift
  if "$@" >"$tmp/log" 2>&1; then pass=$((pass + 1)); echo "ok: $name"
  else fail=$((fail + 1)); echo "FAILED: $name"; tail -20 "$tmp/log"; fi
}
check "configure, default generator, CUDA off" cmake -S "$src" -B "$tmp/cpu" -DSQUEEZEKV_CUDA=OFF -DSQUEEZEKV_TESTS=OFF
grep -q 'CMAKE_GENERATOR:INTERNAL=Unix Makefiles' "$tmp/cpu/CMakeCache.txt" || { echo "FAILED: the default generator is not Unix Makefiles"; fail=$((fail + 1)); }
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  check "configure, default generator, CUDA found" cmake -S "$src" -B "$tmp/cuda" -DSQUEEZEKV_TESTS=OFF
  grep -q 'SQUEEZEKV_CUDA:BOOL=ON' "$tmp/cuda/CMakeCache.txt" || { echo "FAILED: nvcc is installed but SQUEEZEKV_CUDA is not on"; fail=$((fail + 1)); }
  # two of the CUDA backend's files through make (every .cu file is compiled with the same flags;
  # the whole backend takes ~110 s of CI, the release build compiles all of it with Ninja)
  check "CUDA files through make" make -C "$tmp/cuda" src/backend/cuda/norm.cu.o src/backend/cuda/launcher.cu.o
else
  echo "no nvcc: the CUDA configure is not tried"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
