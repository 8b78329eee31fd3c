#!/usr/bin/env bash
# cuBLASLt's timing once per bucket of batch sizes (gemm_lt.h) and the prompt's first token
# picked on the device (Engine::prefill_sampled): the whole cuda_test, then a fresh server's 4
# rounds of 64 streams, each round's own figure, the build before both (out/base, commit a90db89:
# every batch size timed, first tokens sampled on the host) and this one (out/dev) alternated, and
# this one with --prefill-chunk 2048 (up to 2048 prompt tokens a step); then `squeezekv bench -b
# 64` under squeeze at both chunks.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
lib() { echo "$PWD/out/$1/lib:$PWD/out/base/lib:/usr/local/cuda/lib64"; }
echo "== cuda_test"
LD_LIBRARY_PATH=$(lib dev) timeout 150 out/dev/cuda_test > $OUT/cuda_test_d.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure" $OUT/cuda_test_d.txt | head -20
serve() {  # build, n, server flags...
  local build=$1 n=$2; shift 2
  set -- $build $n "$@"
  echo "== $1 serve squeeze 512, 64 streams ($2) ${*:3}" | tee -a $OUT/serve_d.txt
  LD_LIBRARY_PATH=$(lib $1) timeout 150 python3 bench/bench_server.py --bin out/$1/squeezekv --dummy bench/configs/llama-3.1-8b.json \
    --streams 64 --tokens 128 --rounds 4 -t 4 --client raw --temperature 0 --json $OUT/serve_d_$1_$2.json -- --device cuda --ctx 2048 \
    --kv-policy squeeze --kv-budget 512 "${@:3}" 2>&1 | tail -2 | tee -a $OUT/serve_d.txt
  python3 -c "import json,sys; print('rounds:', [round(x) for x in json.load(open(sys.argv[1]))['rows'][0]['aggregate_runs']])" \
    $OUT/serve_d_$1_$2.json 2>&1 | tee -a $OUT/serve_d.txt
}
serve base 1; serve dev 1; serve dev 2; serve base 2; serve dev 3 --prefill-chunk 2048
for chunk in 512 2048; do
  echo "== dev bench squeeze 512, chunk $chunk" | tee -a $OUT/bench_d.txt
  LD_LIBRARY_PATH=$(lib dev) timeout 150 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json \
    --ctx 2048 -p 80 -n 0 -d 0 -b 64 -r 3 --kv-policy squeeze --kv-budget 512 --prefill-chunk $chunk 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_d.txt
done
