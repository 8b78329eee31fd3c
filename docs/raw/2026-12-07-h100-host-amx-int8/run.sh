#!/usr/bin/env bash
# Block types' prompt products on AMX int8 tiles against AVX-512 VNNI alone (issue 32), on the GPU
# machine's 16 Xeon cores: first cuda_test's DecodeBatchSplitByTheBatchWithinRounding (its prompts
# now given in chunks; the GPU then idle), then CPU only: the products' tests with AMX on (the
# default there) and off (SQUEEZEKV_CPU=avx512), every product alone at 512 rows over the
# Llama-3.2-1B shape's matrices in Q8_0, Q4_0, Q4_K (`squeezekv_bench_ops --weights`, on/off
# alternated, OPS_THREADS), and `squeezekv bench -p 512 -n 16` on
# random-weight SmolLM2-135M shapes (Q8_0, Q4_0, Q4_K_M: on/off alternated) at THREADS and the
# Llama-3.2-1B shape in Q8_0 and Q4_K_M at BIG_THREADS, ROUNDS rounds. squeezekv alone.
# Carry: out/devsys.tar.xz (bench/cuda/stage_device.sh, with build/tests/ops_test copied into out/dev).
#   OUT=DIR [LIMIT=400 THREADS="1 4 16" BIG_THREADS="8 16" ROUNDS=2 OPS_THREADS="1 16"] bash docs/raw/2026-12-07-h100-host-amx-int8/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-400} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
{ lscpu; nproc; free -g; nvidia-smi -L; } > $OUT/machine.txt 2>&1
timeout 120 out/dev/cuda_test --gtest_filter='Cuda.DecodeBatchSplitByTheBatchWithinRounding' > $OUT/cuda_test.txt 2>&1
el "cuda_test rc $?: $(grep -E 'split by the batch|^\[  (PASSED|FAILED) ' $OUT/cuda_test.txt | tr '\n' ' ')"
for cap in native avx512; do
  SQUEEZEKV_CPU=$cap OMP_NUM_THREADS=4 timeout 120 out/dev/ops_test --gtest_filter='Tile8.*:Group16.*:Matmul.*' > $OUT/ops_test_$cap.txt 2>&1
  el "ops_test SQUEEZEKV_CPU=$cap rc $?: $(grep -E '^\[  (PASSED|FAILED) ' $OUT/ops_test_$cap.txt | tr '\n' ' ')"
done
C=bench/configs/smollm2-135m.json B=bench/configs/llama-3.2-1b.json
# every product alone at 512 rows over the 1B shape's matrices, AMX on/off alternated
for t in ${OPS_THREADS:-1 16}; do for w in Q8_0 Q4_0 Q4_K; do for cap in native avx512 native avx512; do
  left 60 && SQUEEZEKV_CPU=$cap out/dev/squeezekv_bench_ops --config $B -t $t --batch 1 --chunk 512 --rounds 3 --filter gemm \
    --decode-activations int8 --weights $w 2>&1 | grep -E "^\| gemm" | sed "s/^/$cap $w t$t /" >> $OUT/ops.txt
done; done; done
el "ops"
sq() { SQUEEZEKV_CPU=$1 out/dev/squeezekv bench "${@:2}" 2>/dev/null | grep -E "^\| (pp|tg)|^device|kernels"; }
for r in $(seq 1 ${ROUNDS:-2}); do
  for t in ${THREADS:-1 4 16}; do
    for v in Q8_0:native Q8_0:avx512 Q4_0:native Q4_0:avx512 Q4_K_M:native Q4_K_M:avx512; do
      left 20 && sq ${v#*:} --dummy $C --dummy-type ${v%:*} -t $t -p 512 -n 16 -r 1 | sed "s/^/$r $v t$t /" >> $OUT/bench.txt
    done
  done
  for t in ${BIG_THREADS:-8 16}; do
    for v in Q8_0:native Q8_0:avx512 Q4_K_M:native Q4_K_M:avx512; do
      left 30 && sq ${v#*:} --dummy $B --dummy-type ${v%:*} -t $t -p 512 -n 8 -r 1 | sed "s/^/$r 1B.$v t$t /" >> $OUT/bench.txt
    done
  done
  el "round $r"
done
grep -vE "device|kernels" $OUT/bench.txt; grep -m4 -E "device|kernels" $OUT/bench.txt; cat $OUT/ops.txt
el done
