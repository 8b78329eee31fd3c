#!/usr/bin/env bash
# The KV pool against the device memory a run really takes: 27 sequences of q8_0 rows at context
# 32768 (what the default pool admitted on an 80 GB card) ran out of device memory mid-run on
# 2026-12-06 (../2026-12-06-h100-serving-q8/): the pool counted each layer's four arrays at their
# sizes while the device's allocator took each in whole 2 MiB blocks (~5.8 MiB a layer more, 5 GB
# over 27 x 32 layers). Now a layer's arrays are one slab, counted as the allocator takes it. Here:
# 27 sequences (the pool must refuse the 27th with its message), 26 (must run), f16 rows' 14, and
# 64 x 4096 under squeeze 1024 (a squeeze schedule re-lays out every layer's slab), with
# nvidia-smi's used memory sampled beside each; cuda_test first; then one sequence at depth 32768,
# f16 and q8_0 rows alternated, two rounds (the device this call gets). Carry: out/devsys.tar.xz.
#   OUT=DIR bash docs/raw/2026-12-06-h100-pool-headroom/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-290} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee $OUT/gpu.txt
el "cuda_test"
timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure|decode attention" $OUT/cuda_test.txt | head
C=bench/configs/llama-3.1-8b.json
ours() { echo "== squeezekv $*" >> $OUT/bench.txt; el "$*"
  ( while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.5; done ) > $OUT/smi.tmp &
  sp=$!
  timeout 150 out/dev/squeezekv bench --device cuda --dummy $C -p 0 -n 32 -r 3 "$@" 2>&1 | grep -E "^\| tg|rror" >> $OUT/bench.txt
  kill $sp; echo "   nvidia-smi used MiB: max $(sort -n $OUT/smi.tmp | tail -1)" >> $OUT/bench.txt; }
ours -b 27 -d 32768 --kv-type q8_0
ours -b 26 -d 32768 --kv-type q8_0
ours -b 14 -d 32768
ours -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024 --kv-type q8_0
for r in 1 2; do
  left 30 && ours -d 32768 --kv-type f16
  left 30 && ours -d 32768 --kv-type q8_0
done
cat $OUT/bench.txt
el done
