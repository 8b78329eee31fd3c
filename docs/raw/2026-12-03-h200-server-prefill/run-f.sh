#!/usr/bin/env bash
# The scheduler issues each decode step before it streams the step before's tokens
# (Engine::issue_decode / decode_picks): the whole cuda_test on this build (out/dev), then a
# fresh server's 3 rounds of 64 streams, the build before (out/base, commit 656f6bc) and this one
# alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
lib() { echo "$PWD/out/$1/lib:$PWD/out/base/lib:/usr/local/cuda/lib64"; }
echo "== cuda_test"
LD_LIBRARY_PATH=$(lib dev) timeout 120 out/dev/cuda_test > $OUT/cuda_test_f.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure" $OUT/cuda_test_f.txt | head -20
serve() {  # build, n
  echo "== $1 serve squeeze 512, 64 streams ($2)" | tee -a $OUT/serve_f.txt
  LD_LIBRARY_PATH=$(lib $1) timeout 100 python3 bench/bench_server.py --bin out/$1/squeezekv --dummy bench/configs/llama-3.1-8b.json \
    --streams 64 --tokens 128 --rounds 3 -t 4 --client raw --temperature 0 --json $OUT/serve_f_$1_$2.json -- --device cuda --ctx 2048 \
    --kv-policy squeeze --kv-budget 512 2>&1 | tail -2 | tee -a $OUT/serve_f.txt
  python3 -c "import json,sys; print('rounds:', [round(x) for x in json.load(open(sys.argv[1]))['rows'][0]['aggregate_runs']])" \
    $OUT/serve_f_$1_$2.json 2>&1 | tee -a $OUT/serve_f.txt
}
serve base 1; serve dev 1; serve dev 2; serve base 2
