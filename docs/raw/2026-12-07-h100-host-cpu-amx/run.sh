#!/usr/bin/env bash
# BF16 prompt products on AMX tiles against AVX-512 BF16 alone (issue 32), on the GPU machine's 16
# Xeon cores (CPU only, no GPU work): the products' tests with AMX on (the default there) and off
# (SQUEEZEKV_CPU=avx512); every product alone at 512 rows (`squeezekv_bench_ops --filter gemm --decode-activations int8`,
# bf16 weights) at OPS_THREADS, AMX on/off alternated; then `squeezekv bench -p 512 -n 32` on
# random-weight SmolLM2-135M shapes (BF16 on/off alternated, Q8_0 and Q4_0 beside them) at THREADS
# and the Llama-3.2-1B shape (BF16 on/off, Q8_0; -n 16) at BIG_THREADS, ROUNDS rounds. squeezekv alone.
# Carry: out/devsys.tar.xz (bench/cuda/stage_device.sh, with build/tests/ops_test copied into out/dev).
#   OUT=DIR [LIMIT=480 THREADS="1 2 4 8 16" BIG_THREADS="4 8 16" ROUNDS=2 OPS_THREADS="1 4 16"] bash docs/raw/2026-12-07-h100-host-cpu-amx/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-480} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib
{ lscpu; nproc; free -g; } > $OUT/machine.txt 2>&1
for cap in native avx512; do
  SQUEEZEKV_CPU=$cap OMP_NUM_THREADS=4 timeout 120 out/dev/ops_test --gtest_filter='Matmul.*' > $OUT/ops_test_$cap.txt 2>&1
  el "ops_test Matmul.* SQUEEZEKV_CPU=$cap rc $?: $(grep -E '^\[  (PASSED|FAILED) ' $OUT/ops_test_$cap.txt | tr '\n' ' ')"
done
C=bench/configs/smollm2-135m.json B=bench/configs/llama-3.2-1b.json
for t in ${OPS_THREADS:-1 4 16}; do for cap in native avx512 native avx512; do
  left 60 && SQUEEZEKV_CPU=$cap out/dev/squeezekv_bench_ops --config $C -t $t --batch 1 --chunk 512 --rounds 3 --filter gemm --decode-activations int8 2>&1 |
    grep -E "^# cpu|gemm" | sed "s/^/$cap t$t /" >> $OUT/ops.txt
done; done
el "ops"
sq() { SQUEEZEKV_CPU=$1 out/dev/squeezekv bench "${@:2}" 2>/dev/null | grep -E "^\| (pp|tg)|^device"; }
for r in $(seq 1 ${ROUNDS:-2}); do
  for t in ${THREADS:-1 2 4 8 16}; do
    for v in BF16:native BF16:avx512 Q8_0:native Q4_0:native; do
      left 30 && sq ${v#*:} --dummy $C --dummy-type ${v%:*} -t $t -p 512 -n 32 -r 1 | sed "s/^/$r $v t$t /" >> $OUT/bench.txt
    done
    if echo " ${BIG_THREADS:-4 8 16} " | grep -q " $t "; then for v in BF16:native BF16:avx512 Q8_0:native; do
      left 40 && sq ${v#*:} --dummy $B --dummy-type ${v%:*} -t $t -p 512 -n 16 -r 1 | sed "s/^/$r 1B.$v t$t /" >> $OUT/bench.txt
    done; fi
  done
  el "round $r"
done
grep -v "^.*device" $OUT/bench.txt; grep -m2 device $OUT/bench.txt; cat $OUT/ops.txt
el done
