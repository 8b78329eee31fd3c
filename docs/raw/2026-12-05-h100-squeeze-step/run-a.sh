#!/usr/bin/env bash
# What squeeze adds to a decode step, and the step's evictions in one launch (8B shape, bf16 dummy
# weights, f16 KV). out/dev: the build with the eviction table (every layer of every sequence in
# one launch), its cuda_test first; out/before/lib: the build before (32 layers a launch, the
# entries as the kernel's argument). 64 sequences holding 1024 rows each with the full cache
# (depth 1024) beside squeeze 1024 and h2o 1024 after 4096 tokens, and 128 sequences holding 2048
# (depth 2048, full) beside squeeze 2048 after 32768; the two builds alternated twice. Then every
# kernel's time in a decode step of 64 sequences under squeeze 1024 (ncu, one pass, clocks as in
# a real run): the same run with 6 and with 2 decode steps, the difference divided by 4.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
S=out/dev/squeezekv; C=bench/configs/llama-3.1-8b.json
lib() { export LD_LIBRARY_PATH=$PWD/out/$1/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $OUT/gpu.txt
lib dev
timeout 240 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "cuda_test rc $?"
grep -E "FAILED|PASSED|Failure" $OUT/cuda_test.txt | head -12
sb() { echo "== $B $*" >> $OUT/bench.txt; timeout 150 $S bench --dummy $C --device cuda -p 0 -r 3 "$@" 2>&1 | grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
for round in 1 2; do
  for B in before dev; do
    lib $B
    sb -b 64 -d 4096 -n 32 --kv-policy squeeze --kv-budget 1024
    sb -b 128 -d 32768 -n 16 --kv-policy squeeze --kv-budget 2048
    [ $round = 1 ] && sb -b 64 -d 4096 -n 32 --kv-policy h2o --kv-budget 1024
    [ $round = 1 ] && [ $B = dev ] && sb -b 64 -d 1024 -n 32
    [ $round = 1 ] && [ $B = dev ] && sb -b 128 -d 2048 -n 16
  done
done
cat $OUT/bench.txt
lib dev
for n in 2 6; do
  timeout 150 ncu --csv --clock-control none --metrics gpu__time_duration.sum \
    $S bench --dummy $C --device cuda -b 64 -p 0 -d 1280 -n $n -r 1 --no-warmup --cuda-graphs off \
    --kv-policy squeeze --kv-budget 1024 > $OUT/ncu_n$n.csv 2> $OUT/ncu_n$n.err
  echo "ncu n=$n rc $? lines $(wc -l < $OUT/ncu_n$n.csv)"
done
python3 - $OUT/ncu_n2.csv $OUT/ncu_n6.csv <<'PY' | tee $OUT/step_kernels.txt
import csv, sys, collections
def load(p):
    t = collections.Counter(); c = collections.Counter()
    rows = [l for l in open(p) if l.startswith('"')]
    for r in csv.DictReader(rows):
        if r.get("Metric Name") != "gpu__time_duration.sum": continue
        v = float(r["Metric Value"].replace(",", "")); u = r["Metric Unit"]
        v *= {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}.get(u, 1)
        k = r["Kernel Name"].split("(")[0][:60]; t[k] += v; c[k] += 1
    return t, c
t2, c2 = load(sys.argv[1]); t6, c6 = load(sys.argv[2])
d = {k: (t6[k] - t2[k]) / 4 for k in set(t2) | set(t6)}
tot = sum(v for v in d.values() if v > 0)
print(f"per decode step of 64 sequences, squeeze 1024: {tot:.0f} us of kernels")
for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:30]:
    print(f"{v:9.1f} us  {100*v/tot:5.1f}%  launches/step {(c6[k]-c2[k])/4:6.1f}  {k}")
PY
