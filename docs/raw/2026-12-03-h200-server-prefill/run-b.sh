#!/usr/bin/env bash
# A prefill step's parts in one tensor-core launch (CudaBackend::prompt_batch): the whole
# cuda_test on this build (out/dev), then `squeezekv bench -b 64` (64 prompts of 80 tokens as the
# server runs them, and 128 decode steps) and the server at 64 streams, this build and the one
# before it (out/base, commit a90db89 with the bench's pp x B) alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
lib() { echo "$PWD/out/$1/lib:$PWD/out/base/lib:/usr/local/cuda/lib64"; }
echo "== cuda_test"
LD_LIBRARY_PATH=$(lib dev) timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|prompt parts|tensor cores:" $OUT/cuda_test.txt | head -20
bench() {  # build, label, flags...
  local build=$1 label=$2; shift 2
  echo "== $build $label" | tee -a $OUT/bench_b.txt
  LD_LIBRARY_PATH=$(lib $build) timeout 150 out/$build/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json \
    --ctx 2048 -p 80 -n 128 -d 0 -b 64 -r 3 "$@" 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_b.txt
}
serve() {  # build
  echo "== $1 serve squeeze 512, 64 streams" | tee -a $OUT/serve_b.txt
  LD_LIBRARY_PATH=$(lib $1) timeout 120 python3 bench/bench_server.py --bin out/$1/squeezekv --dummy bench/configs/llama-3.1-8b.json \
    --streams 64 --tokens 128 --rounds 2 -t 4 --client raw --temperature 0 -- --device cuda --ctx 2048 --kv-policy squeeze \
    --kv-budget 512 2>&1 | tail -2 | tee -a $OUT/serve_b.txt
}
bench base "squeeze 512" --kv-policy squeeze --kv-budget 512
bench dev "squeeze 512" --kv-policy squeeze --kv-budget 512
bench dev "full" --kv-policy full
bench base "full" --kv-policy full
bench dev "h2o 512" --kv-policy h2o --kv-budget 512
serve base; serve dev; serve dev; serve base
