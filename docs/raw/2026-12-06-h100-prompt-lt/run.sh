#!/usr/bin/env bash
# A prompt chunk's bf16 products on cuBLASLt's algorithm timed for each shape (CudaOptions::
# prompt_lt, the default since this folder's commit) against cuBLAS's own choice
# (SQUEEZEKV_CUDA_PROMPT_LT=0), beside llama.cpp CUDA's llama-bench on a GGUF of the same 8B shape
# (random BF16 weights written by bench/make_dummy_gguf.py), in one device call; cuda_test first.
# Carry: out/devsys.tar.xz (dev/: squeezekv, cuda_test, libraries, the tiny test models; sys/lib:
# Debian's pcre2, cpp-httplib, gomp, z), out/peer/llama.tar.xz (bench/cuda/build_llamacpp_cuda.sh),
# out/peer/gguf-py.   OUT=DIR bash docs/raw/2026-12-06-h100-prompt-lt/run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-560} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out && tar xJf out/peer/llama.tar.xz -C out/peer
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
LL=$PWD/out/peer/llama/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64${nccl:+:$nccl}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee $OUT/gpu.txt
g=/dev/shm/gguf; mkdir -p $g
( PYTHONPATH=out/peer/gguf-py timeout 200 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json $g/8b.BF16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $?" >> $OUT/gguf.txt ) &
el "cuda_test"
timeout 200 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure" $OUT/cuda_test.txt | head -12
wait; cat $OUT/gguf.txt
C=bench/configs/llama-3.1-8b.json
ours() { echo "== squeezekv SQUEEZEKV_CUDA_PROMPT_LT=$1 $2" >> $OUT/bench.txt
  env SQUEEZEKV_CUDA_PROMPT_LT=$1 timeout 120 out/dev/squeezekv bench --device cuda --dummy $C $2 -p 512,4096 -n 0 -r 5 2>&1 | grep -E "^\| pp|rror" >> $OUT/bench.txt; }
theirs() { echo "== llama.cpp" >> $OUT/bench.txt
  LD_LIBRARY_PATH=$LL timeout 120 out/peer/llama/bin/llama-bench -m $g/8b.BF16.gguf -ngl 99 -fa 1 -p 512,4096 -n 0 -r 5 2>&1 | grep -E "^\| |rror" >> $OUT/bench.txt; }
for r in 1 2 3; do
  el "round $r"
  left 90 && ours 1 ""
  left 90 && ours 0 ""
  left 60 && theirs
  if [ $r -le 2 ]; then
    left 90 && ours 1 "--dummy-type Q4_K_M"
    left 90 && ours 0 "--dummy-type Q4_K_M"
  fi
done
cat $OUT/bench.txt
# every kernel of one 512-token prompt (the default: timed products), ncu one pass
if left 120; then
  el "ncu"
  timeout 110 ncu --csv --clock-control none --metrics gpu__time_duration.sum out/dev/squeezekv bench --device cuda --dummy $C \
    -p 512 -n 0 -r 1 --no-warmup --cuda-graphs off > $OUT/ncu.csv 2> $OUT/ncu.err
  el "ncu rc $? lines $(wc -l < $OUT/ncu.csv)"
  python3 - $OUT/ncu.csv <<'PY' | tee $OUT/prompt_kernels.txt
import csv, sys, collections
t = collections.Counter(); c = collections.Counter()
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); v = v / 1000 if r[ui] == "nsecond" else v
    k = r[ki][:90]; t[k] += v; c[k] += 1
tot = sum(t.values())
print(f"total {tot/1000:.2f} ms over {sum(c.values())} kernels (the products' timing included)")
for k, v in t.most_common(25): print(f"{v/1000:8.3f} ms {c[k]:5d}x {100*v/tot:5.1f}%  {k}")
PY
fi
el done
