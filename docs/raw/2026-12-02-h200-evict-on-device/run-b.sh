#!/usr/bin/env bash
# Requests that arrive together prefill together: the Scheduler runs every admitted request's
# next prompt chunk (up to one chunk of tokens in all) as one step (Engine::prefill of parts)
# instead of a step each. cuda_test; serve --device cuda, short prompts and 1,052-token prompts,
# squeeze 512 and the full cache, this build (out/dev) and the one before it (out/prev, commit
# 86cd62c) alternated.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
echo "== cuda_test"; LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 200 out/dev/cuda_test > $OUT/cuda_test_b.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure" $OUT/cuda_test_b.txt | head -10
serve() {  # build, label, bench_server flags..., -- serve flags
  local build=$1 label=$2; shift 2
  echo "== $build $label" | tee -a $OUT/serve_b.txt
  LD_LIBRARY_PATH=$PWD/out/$build/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 170 python3 bench/bench_server.py \
    --bin out/$build/squeezekv --dummy bench/configs/llama-3.1-8b.json "$@" 2>&1 | tail -4 | tee -a $OUT/serve_b.txt
}
for build in dev prev; do
  serve $build "short, squeeze 512" --streams 16,64 --tokens 128 --rounds 2 -t 4 -- --device cuda --ctx 2048 --kv-policy squeeze --kv-budget 512
  serve $build "short, full" --streams 16,64 --tokens 128 --rounds 2 -t 4 -- --device cuda --ctx 2048
done
for build in dev prev; do
  serve $build "1052-token prompts, squeeze 512" --streams 16,64 --tokens 64 --prompt-tokens 1024 --rounds 1 -t 4 -- --device cuda --ctx 2048 --kv-policy squeeze --kv-budget 512
done
