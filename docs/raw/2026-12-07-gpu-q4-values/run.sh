#!/usr/bin/env bash
# Q4_1 values beside Q8_0 keys on the device (issue 27): cuda_test first (the decode sweep with the
# two new pairs, the rows' bytes against the CPU's, sessions and survivors against the CPU, batch
# invariance, saved caches); then `squeezekv bench` on the Llama-3.1-8B shape (bf16 dummy
# weights), f16, q8_0 and q8_0/q4_1 rows alternated, two rounds: one sequence at depth 32768
# (full cache), 64 sequences at 4096 (full, and squeeze 1024), and the most sequences of
# q8_0/q4_1 rows the pool admits at 32768; and (issue 26) decode splits of at least 256 keys
# (SQUEEZEKV_CUDA_DECODE_SPLIT_KEYS=256) against the default 128 for f16 rows, 64 sequences and one
# sequence at 4096. Carry: out/devsys.tar.xz (bench/cuda/stage_device.sh).
#   OUT=DIR bash docs/raw/2026-12-07-gpu-q4-values/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-330} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee $OUT/gpu.txt
el "cuda_test"
timeout 180 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure|decode attention|rows|batch 8" $OUT/cuda_test.txt | head -40
C=bench/configs/llama-3.1-8b.json
ours() { echo "== squeezekv ${E:-} $*" >> $OUT/bench.txt; el "${E:-} $*"
  env ${E:-} timeout 120 out/dev/squeezekv bench --device cuda --dummy $C -p 0 -n 32 -r 3 "$@" 2>&1 | grep -E "^\| tg|rror|kv" >> $OUT/bench.txt; }
F16="--kv-type f16" Q8="--kv-type q8_0" Q41="--kv-type q8_0 --kv-type-v q4_1"
for r in 1 2; do
  left 40 && ours $F16 -d 32768
  left 40 && ours $Q8 -d 32768
  left 40 && ours $Q41 -d 32768
  left 40 && ours $Q41 -b 64 -d 4096
  left 40 && ours $Q8 -b 64 -d 4096
  left 40 && ours $F16 -b 64 -d 4096
  left 30 && ours $Q41 -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024
  left 30 && ours $Q8 -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024
done
left 60 && ours $Q41 -b 33 -d 32768
for r in 1 2; do
  left 30 && E=SQUEEZEKV_CUDA_DECODE_SPLIT_KEYS=256 ours $F16 -b 64 -d 4096
  left 30 && ours $F16 -b 64 -d 4096
  left 20 && ours $F16 -d 4096
  left 20 && E=SQUEEZEKV_CUDA_DECODE_SPLIT_KEYS=256 ours $F16 -d 4096
done
cat $OUT/bench.txt
el done
