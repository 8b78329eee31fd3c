#!/usr/bin/env bash
# CPU only (issue 32): the GPU machine's 16 cores beside llama.cpp built there for that CPU
# (-DGGML_NATIVE=ON, the llama-cpp-python 0.3.36 sdist), on the SmolLM2-135M shape with random
# BF16 weights (bench/make_dummy_gguf.py) and llama-quantize's Q4_0, Q4_K_M, Q8_0 of it, and the
# Llama-3.2-1B shape in Q8_0; bench/cpu_threads.sh one round at a time under a deadline (1, 2 and
# 16 threads for the small shape, 16 for the 1B), then squeezekv's decode with threads bound to
# cores (close, spread) and spinning between parallel regions (OMP_WAIT_POLICY=active) against
# libgomp's defaults. One device call with no GPU work in it (the device tool sets OUT):
#   carry out/dev.tar.xz (bench/cuda/stage_device.sh's build, packed as xz: dev/squeezekv, dev/lib),
#   out/sys, out/peer/llama-src.tar.xz and out/peer/gguf-py (stage_device.sh --peer);
#   OUT=DIR bash bench/cpu_threads_device.sh
# Results: steps.txt, table.md (bench/cpu_threads_report.py), bind.txt, runs.tgz (every JSON).
# Environment: THREADS ("1 2 16", the small shape's counts), BIG_THREADS ("16", the 1B's), TYPES
# ("BF16 Q4_0 Q4_K_M Q8_0", the small shape's files), ROUNDS (3), BIND (1: the binding runs),
# LIMIT (560: seconds after which no new step starts).
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
[ -x out/dev/squeezekv ] || tar xJf out/dev.tar.xz -C out  # may hold sys/ and peer/gguf-py too
W=/tmp/cpu32; mkdir -p $W/gguf
{ lscpu; nproc; free -g; } > $OUT/machine.txt 2>&1
( if [ ! -x $W/build/bin/llama-bench ]; then
    mkdir -p $W/src && tar xJf out/peer/llama-src.tar.xz -C $W/src
    cmake -S $W/src/llama.cpp -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF \
      > $OUT/llama_build.txt 2>&1 && timeout 300 cmake --build $W/build -j 16 --target llama-bench llama-quantize >> $OUT/llama_build.txt 2>&1
  fi; el "llama.cpp build rc $?" ) &
for cfg in smollm2-135m llama-3.2-1b; do
  [ -f $W/gguf/$cfg.BF16.gguf ] || PYTHONPATH=out/peer/gguf-py python3 bench/make_dummy_gguf.py bench/configs/$cfg.json $W/gguf/$cfg.BF16.gguf >> $OUT/steps.txt 2>&1
done
wait
export LD_LIBRARY_PATH=$W/build/bin
for q in Q4_0 Q4_K_M Q8_0; do [ -f $W/gguf/smollm2-135m.$q.gguf ] || $W/build/bin/llama-quantize $W/gguf/smollm2-135m.BF16.gguf $W/gguf/smollm2-135m.$q.gguf $q > /dev/null 2>> $OUT/steps.txt; done
[ -f $W/gguf/llama-3.2-1b.Q8_0.gguf ] || $W/build/bin/llama-quantize $W/gguf/llama-3.2-1b.BF16.gguf $W/gguf/llama-3.2-1b.Q8_0.gguf Q8_0 > /dev/null 2>> $OUT/steps.txt
el "files ready"; ls -la $W/gguf >> $OUT/steps.txt
cat > $W/sq <<EOS
#!/bin/sh
exec env LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib $PWD/out/dev/squeezekv "\$@"
EOS
chmod +x $W/sq
small=""
for t in ${TYPES:-BF16 Q4_0 Q4_K_M Q8_0}; do small="$small $W/gguf/smollm2-135m.$t.gguf"; done
L=${LIMIT:-560}
for r in $(seq 1 ${ROUNDS:-3}); do
  [ $(( $(date +%s) - T0 )) -lt $((L - 160)) ] || break
  FIRST_ROUND=$r bash bench/cpu_threads.sh $OUT/runs $W/sq $W/build/bin/llama-bench "${THREADS:-1 2 16}" 1 $small
  [ $(( $(date +%s) - T0 )) -lt $((L - 90)) ] || break
  FIRST_ROUND=$r bash bench/cpu_threads.sh $OUT/runs $W/sq $W/build/bin/llama-bench "${BIG_THREADS:-16}" 1 $W/gguf/llama-3.2-1b.Q8_0.gguf
  el "round $r done"
done
# threads bound to cores (libgomp's OMP_PROC_BIND / OMP_PLACES, read at its start) against unbound,
# squeezekv alone, decode of the 1B shape and the Q8_0 SmolLM2 shape at 16 and 8 threads
for r in 1 2; do
  [ "${BIND:-1}" = 1 ] && [ $(( $(date +%s) - T0 )) -lt $((L - 20)) ] || break
  for f in llama-3.2-1b.Q8_0 smollm2-135m.Q8_0; do for t in 16 8; do for bind in none close spread active; do
    case $bind in
      none) env -u OMP_PROC_BIND -u OMP_PLACES -u OMP_WAIT_POLICY $W/sq bench -m $W/gguf/$f.gguf -t $t -p 0 -n 64 -r 2 ;;
      active) OMP_WAIT_POLICY=active $W/sq bench -m $W/gguf/$f.gguf -t $t -p 0 -n 64 -r 2 ;;  # threads spin between regions
      *) OMP_PROC_BIND=$bind OMP_PLACES=cores $W/sq bench -m $W/gguf/$f.gguf -t $t -p 0 -n 64 -r 2 ;;
    esac 2>/dev/null | grep -E "^\| tg" | sed "s/^/$r $f t$t $bind /"
  done; done; done | tee -a $OUT/bind.txt
done
python3 bench/cpu_threads_report.py $OUT/runs > $OUT/table.md; cat $OUT/steps.txt $OUT/table.md
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $OUT/runs  # 8 files at most come back
