#!/usr/bin/env bash
# squeeze's eviction_error at a prompt's end reads every layer's two sums back in one copy (one
# wait a sequence instead of one a layer): `squeezekv bench -b 64` (64 prompts of 80 tokens, 128
# decode steps) under squeeze, h2o and full on this build; then where a served step's decode
# time goes: 4 rounds of 64 streams with the rounds' own figures (--json), as built, with
# cuBLAS's own algorithm for every batch size (SQUEEZEKV_CUDA_BATCH=blas: no timing of
# candidates at a new batch size) and with --cuda-graphs off.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
lib() { echo "$PWD/out/$1/lib:$PWD/out/base/lib:/usr/local/cuda/lib64"; }
echo "== cuda_test"
LD_LIBRARY_PATH=$(lib dev) timeout 150 out/dev/cuda_test > $OUT/cuda_test_c.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure" $OUT/cuda_test_c.txt | head -20
bench() {  # build, label, flags...
  local build=$1 label=$2; shift 2
  echo "== $build $label" | tee -a $OUT/bench_c.txt
  LD_LIBRARY_PATH=$(lib $build) timeout 150 out/$build/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json \
    --ctx 2048 -p 80 -n 128 -d 0 -b 64 -r 3 "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_c.txt
}
bench dev "squeeze 512" --kv-policy squeeze --kv-budget 512
bench dev "h2o 512" --kv-policy h2o --kv-budget 512
bench dev "squeeze 512 attention_entropy" --kv-policy squeeze --kv-budget 512 --squeeze-metric attention_entropy
serve() {  # label, server flags...
  local label=$1; shift
  echo "== dev serve squeeze 512, 64 streams, $label" | tee -a $OUT/serve_c.txt
  LD_LIBRARY_PATH=$(lib dev) timeout 150 python3 bench/bench_server.py --bin out/dev/squeezekv --dummy bench/configs/llama-3.1-8b.json \
    --streams 64 --tokens 128 --rounds 4 -t 4 --client raw --temperature 0 --json $OUT/serve_c_$label.json -- --device cuda --ctx 2048 \
    --kv-policy squeeze --kv-budget 512 "$@" 2>&1 | tail -2 | tee -a $OUT/serve_c.txt
  python3 -c "import json,sys; print('rounds:', [round(x) for x in json.load(open(sys.argv[1]))['rows'][0]['aggregate_runs']])" \
    $OUT/serve_c_$label.json 2>&1 | tee -a $OUT/serve_c.txt
}
serve built
SQUEEZEKV_CUDA_BATCH=blas serve blas
serve nographs --cuda-graphs off
serve built2
