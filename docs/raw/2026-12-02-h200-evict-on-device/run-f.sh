#!/usr/bin/env bash
# Greedy batches take their tokens on the device (Engine::decode_greedy, Backend::argmax_rows):
# cuda_test; serve --device cuda, short prompts, squeeze 512, greedy and sampled, 16 and 64 streams.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 200 out/dev/cuda_test > $OUT/cuda_test_f.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure" $OUT/cuda_test_f.txt | head -10
for t in "--temperature 0" "--temperature 0.8 --top-p 0.95"; do
  echo "== $t" | tee -a $OUT/serve_f.txt
  timeout 150 python3 bench/bench_server.py --bin out/dev/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 16,64 \
    --tokens 128 --rounds 2 -t 4 $t -- --device cuda --ctx 2048 --kv-policy squeeze --kv-budget 512 2>&1 | tail -6 | tee -a $OUT/serve_f.txt
done
