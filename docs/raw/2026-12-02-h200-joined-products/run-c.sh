#!/usr/bin/env bash
# squeeze's eviction_error measured at the step's end (the last rows kept at each layer's
# attention; every layer's cut attention issued, then read): cuda_test; a 128-token prompt under
# the full cache, h2o and squeeze (budget 64) as in run-a.sh; serve --device cuda with short
# prompts, squeeze 512 against the full cache (as run-e.sh of 2026-12-02-h200-kv-pool); and
# run-b.sh's serve run of 1,024-token prompts at 16 and 64 streams again, which failed there
# (bench_server.py now names a failed stream's error).
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 150 out/dev/cuda_test > $OUT/cuda_test_c.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|Expected|Which is" $OUT/cuda_test_c.txt | head -20
for p in "--kv-policy full" "--kv-policy h2o --kv-budget 64" "--kv-policy squeeze --kv-budget 64"; do
  echo "== pp128 $p"; timeout 100 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -r 5 -p 128 -n 0 $p 2>&1 | grep -E "^\| pp|rror" | tee -a $OUT/bench_c.txt
done
for kv in "--kv-policy squeeze --kv-budget 512" ""; do
  echo "== serve short prompts $kv"
  timeout 150 python3 bench/bench_server.py --bin out/dev/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 16,64 \
    --tokens 128 --rounds 2 -t 4 -- --device cuda --ctx 2048 $kv 2>&1 | tail -5 | tee -a $OUT/serve_c.txt
done
echo "== serve 1024-token prompts"
timeout 150 python3 bench/bench_server.py --bin out/dev/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 16,64 \
  --tokens 64 --rounds 1 --prompt-tokens 1024 -t 4 -- --device cuda --ctx 2048 --kv-policy squeeze --kv-budget 512 2>&1 | tail -6 | tee -a $OUT/serve_c.txt
