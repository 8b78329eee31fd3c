#!/usr/bin/env bash
# Sampling on the device (Backend::sample_rows, src/backend/cuda/sample.cu): the whole cuda_test,
# the kernel alone (squeezekv_bench_ops), then serve --device cuda, 8B shape, short prompts, squeeze 512, 64 streams: the build before
# (out/base, commit 0ec3b92: decode batches sampled on the host's threads) and this one (out/dev)
# alternated, sampled as bench_server.py's earlier rows (temperature 0.8, top_p 0.95), the API's
# defaults (temperature 1, top_p 1) and greedy.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
echo "== cuda_test"
LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|sample_rows:" $OUT/cuda_test.txt | head -20
echo "== sample_rows alone"
LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 60 out/dev/squeezekv_bench_ops --device cuda \
  --config bench/configs/llama-3.1-8b.json --batch 1,64 --filter sample --rounds 3 2>&1 | tee $OUT/bench_ops.txt
serve() {  # build, label, bench_server flags...
  local build=$1 label=$2; shift 2
  echo "== $build $label" | tee -a $OUT/serve.txt
  LD_LIBRARY_PATH=$PWD/out/$build/lib:$PWD/out/dev/lib:/usr/local/cuda/lib64 timeout 120 python3 bench/bench_server.py \
    --bin out/$build/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 64 --tokens 128 --rounds 2 -t 4 \
    --client raw "$@" -- --device cuda --ctx 2048 --kv-policy squeeze --kv-budget 512 2>&1 | tail -4 | tee -a $OUT/serve.txt
}
for round in 1 2; do
  serve base "top_p 0.95" --temperature 0.8 --top-p 0.95
  serve dev "top_p 0.95" --temperature 0.8 --top-p 0.95
done
serve base "temperature 1" --temperature 1 --top-p 1
serve dev "temperature 1" --temperature 1 --top-p 1
serve dev greedy --temperature 0
serve base greedy --temperature 0
