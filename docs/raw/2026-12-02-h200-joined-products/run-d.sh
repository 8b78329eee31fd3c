#!/usr/bin/env bash
# The CUDA backend as a library of its own (libsqueezekv_cuda.so, loaded at the first --device
# cuda) and the server's listen backlog raised past cpp-httplib's 5: cuda_test; one sequence and
# 64 at 512 as in run-b.sh (the same figures expected); serve --device cuda with short prompts,
# squeeze 512 against the full cache, 16 and 64 streams (run-c.sh's squeeze run lost one of 64
# streams to a reset connection).
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
ldd out/dev/squeezekv | grep -ciE "cublas|cudart" | sed 's/^/CUDA libraries the CLI links: /'
echo "== cuda_test"; timeout 150 out/dev/cuda_test > $OUT/cuda_test_d.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|Expected|Which is" $OUT/cuda_test_d.txt | head -20
E="out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -r 3"
$E -p 512 -n 64 -d 0 -b 1 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_d.txt
$E -p 0 -n 32 -d 512 -b 64 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_d.txt
for kv in "--kv-policy squeeze --kv-budget 512" ""; do
  echo "== serve short prompts $kv"
  timeout 150 python3 bench/bench_server.py --bin out/dev/squeezekv --dummy bench/configs/llama-3.1-8b.json --streams 16,64 \
    --tokens 128 --rounds 2 -t 4 -- --device cuda --ctx 2048 $kv 2>&1 | tail -5 | tee -a $OUT/serve_d.txt
done
out/dev/squeezekv serve --dummy bench/configs/llama-3.1-8b.json --device cuda --port 18181 > /dev/null 2>&1 &
for i in $(seq 90); do curl -s localhost:18181/health > /dev/null && break; sleep 1; done
ss -ltnH "sport = :18181" | tee $OUT/backlog_d.txt
kill %1; wait
