#!/usr/bin/env bash
# Where squeezekv's CPU prompt stops scaling (issue 32): on the GPU machine's 16 cores (CPU only, no
# GPU work), the SmolLM2-135M shape with random weights (--dummy, BF16 / Q8_0 / Q4_0) and the
# Llama-3.2-1B shape in Q8_0, `squeezekv bench -p 512 -n 32` at 1 to 16 threads, two rounds;
# then every op alone at 512 rows (`squeezekv_bench_ops --filter gemm`, bf16 weights) at 2, 4, 8
# and 16 threads. squeezekv alone: llama.cpp's figures for the same machine kind are in
# docs/raw/2026-12-06-h100-host-cpu-*. Then, after the CPU runs, the whole cuda_test. Carry:
# out/devsys.tar.xz (bench/cuda/stage_device.sh).
#   OUT=DIR [LIMIT=240 THREADS="1 2 4 6 8 12 16" TYPES="BF16 Q8_0 Q4_0" ROUNDS=2 BIG=1 OPS_THREADS="2 4 8 16" CUDA_TEST=1] \
#     bash docs/raw/2026-12-07-host-cpu-scaling/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-240} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib
{ lscpu; nproc; free -g; } > $OUT/machine.txt 2>&1
C=bench/configs/smollm2-135m.json B=bench/configs/llama-3.2-1b.json
sq() { out/dev/squeezekv bench "$@" 2>/dev/null | grep -E "^\| (pp|tg)"; }
for r in $(seq 1 ${ROUNDS:-2}); do
  for t in ${THREADS:-1 2 4 6 8 12 16}; do
    for ty in ${TYPES:-BF16 Q8_0 Q4_0}; do
      left 20 && sq --dummy $C --dummy-type $ty -t $t -p 512 -n 32 -r 1 | sed "s/^/$r $ty t$t /" >> $OUT/bench.txt
    done
    if [ "${BIG:-1}" = 1 ] && [ $t -ge 4 ]; then left 30 && sq --dummy $B --dummy-type Q8_0 -t $t -p 512 -n 32 -r 1 | sed "s/^/$r 1B.Q8_0 t$t /" >> $OUT/bench.txt; fi
  done
  el "round $r"
done
for t in ${OPS_THREADS:-2 4 8 16}; do
  left 15 && out/dev/squeezekv_bench_ops --config $C -t $t --batch 1 --chunk 512 --rounds 3 --filter gemm 2>&1 | sed "s/^/t$t /" >> $OUT/ops.txt
done
cat $OUT/bench.txt $OUT/ops.txt
# after the CPU runs (CUDA_TEST=0: none): the whole cuda_test of this build (the q4_1 values' session bound, 5e-3)
[ "${CUDA_TEST:-1}" = 0 ] && { el done; exit 0; }
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
el "cuda_test"; timeout 120 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED|q4_1 values:" $OUT/cuda_test.txt
el done
