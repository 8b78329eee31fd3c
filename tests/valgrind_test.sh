#!/usr/bin/env bash
# valgrind memcheck over the CLI given malformed inputs (scripts/make_malformed.py: truncated files,
# oversized counts and dimensions, offsets past the end, wrong types, bad UTF-8, missing tensors,
# bad JSON): every case must end with a message or a normal run, never a crash, and memcheck must
# report no error (invalid reads or writes, uninitialised values, definite leaks).
set -u
bin="$1"; root="$2"
dir="$(mktemp -d)"; trap 'rm -rf "$dir"' EXIT
python3 "$root/scripts/make_malformed.py" "$dir/cases" >/dev/null || { echo "FAIL: make_malformed.py"; exit 1; }
# one case: its verdict on stdout ("ok NAME" or "FAIL: NAME: why" and the evidence)
run_case() {
  local d="$1" name; name="$(basename "$1")"
  local args=() l rc log="$d/vg.log" out="$d/out.log"
  while IFS= read -r l; do args+=("${l//@/${d%/}}"); done < "$d/args"
  valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
    --suppressions="$root/tests/valgrind.supp" --log-file="$log" \
    "$bin" generate -t 1 "${args[@]}" > "$out" 2>&1 < /dev/null
  rc=$?
  if [ $rc -eq 99 ] || [ -s "$log" ]; then echo "FAIL: $name: memcheck reported errors (rc $rc)"; cat "$log"
  elif [ $rc -gt 128 ]; then echo "FAIL: $name: crashed (rc $rc)"; tail -3 "$out"
  elif [ $rc -ne 0 ] && ! grep -q "error:" "$out"; then echo "FAIL: $name: exit $rc without a message"; tail -3 "$out"
  else echo "ok $name"; fi
}
export -f run_case; export bin root
# two cases at a time (valgrind's start-up dominates: the CUDA libraries are large)
ls -d "$dir"/cases/*/ | xargs -P 2 -I{} bash -c 'run_case "{}"' > "$dir/results.log"
grep -v "^ok " "$dir/results.log"
pass=$(grep -c "^ok " "$dir/results.log"); fail=$(grep -c "^FAIL" "$dir/results.log")
echo "valgrind_test: $pass cases clean, $fail failed"
[ $fail -eq 0 ] && [ $pass -gt 30 ]
