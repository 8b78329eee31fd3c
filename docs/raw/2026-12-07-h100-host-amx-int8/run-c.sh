#!/usr/bin/env bash
# The pipelined AMX int8 kernel (two groups in flight) against AVX-512 VNNI alone, tight enough for
# the device time left: one product alone (`squeezekv_bench_ops --filter "gemm q"`, the 1B shape's
# 2048 x 2048 q matrix at 256 rows, one thread; run.sh's all-products sweep at 512 rows spent its
# limit on the 128256-row head), AMX on/off alternated twice for Q8_0, Q4_0, Q4_K; then
# `squeezekv bench -p 512 -n 8` on the SmolLM2-135M shape (Q8_0, Q4_0, Q4_K_M) at 1 and 16
# threads and the 1B shape in Q8_0 at 16, on/off alternated, one round. CPU only.
# Carry: out/devsys.tar.xz.   OUT=DIR [LIMIT=240] bash docs/raw/2026-12-07-h100-host-amx-int8/run-c.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-240} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib
C=bench/configs/smollm2-135m.json B=bench/configs/llama-3.2-1b.json
for w in Q8_0 Q4_0 Q4_K; do for cap in native avx512 native avx512; do
  left 30 && SQUEEZEKV_CPU=$cap timeout 40 out/dev/squeezekv_bench_ops --config $B -t 1 --batch 1 --chunk 256 --rounds 3 --filter "gemm q" \
    --decode-activations int8 --weights $w 2>&1 | grep -E "^\| gemm" | sed "s/^/$cap $w t1 /" >> $OUT/ops.txt
done; done
el "ops"; cat $OUT/ops.txt
sq() { SQUEEZEKV_CPU=$1 timeout 40 out/dev/squeezekv bench "${@:2}" 2>/dev/null | grep -E "^\| pp"; }
for t in 1 16; do for v in Q8_0:native Q8_0:avx512 Q4_0:native Q4_0:avx512 Q4_K_M:native Q4_K_M:avx512; do
  left 15 && sq ${v#*:} --dummy $C --dummy-type ${v%:*} -t $t -p 512 -n 8 -r 1 | sed "s/^/$v t$t /" >> $OUT/bench.txt
done; done
for v in Q8_0:native Q8_0:avx512; do left 20 && sq ${v#*:} --dummy $B --dummy-type ${v%:*} -t 16 -p 512 -n 8 -r 1 | sed "s/^/1B.$v t16 /" >> $OUT/bench.txt; done
el done; cat $OUT/bench.txt
