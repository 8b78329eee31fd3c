#!/usr/bin/env bash
# One sequence at depth 32768 (issue 26's open 1.1x): the decode splits' merge by 8 warps, each
# summing a share of the splits, in blocks of 32 columns where a launch has few rows (a lone
# sequence's 32) and whole rows otherwise (dev), against one block a row whose threads each stream
# every split of one column (base, commit ec58799). cuda_test of dev, then the two builds
# alternated on one card: steps (`squeezekv bench`, 8B shape, random BF16 weights) of one
# sequence at 32768 (f16 rows), the decode attention alone (`squeezekv_bench_ops --batch 1
# --depths 32768 --filter "attn decode"`), 64 x 4096 under squeeze 1024 over q8_0 rows (the batch's
# merge), then Nsight Compute's duration of each attention and merge kernel, while LIMIT lasts.
# Carry: out/devsys.tar.xz (dev/ with squeezekv, squeezekv_bench_ops, cuda_test; base/lib; sys/lib).
#   OUT=DIR [LIMIT=s] bash run.sh
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-300} - ($(date +%s) - T0) )) -ge "$1" ]; }
tar xJf out/devsys.tar.xz -C out
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
LIBS=$PWD/out/sys/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=bench/configs/llama-3.1-8b.json
ops() { local b=$1; shift; echo "== $b squeezekv_bench_ops $*" >> $OUT/ops.txt; el "$b ops $*"
  LD_LIBRARY_PATH=$PWD/out/$b/lib:$LIBS timeout 60 out/dev/squeezekv_bench_ops --device cuda --config $C --rounds 5 --filter "attn decode" "$@" 2>&1 |
    grep -E "attn decode|rror" >> $OUT/ops.txt; }
ours() { local b=$1; shift; echo "== $b squeezekv $*" >> $OUT/bench.txt; el "$b $*"
  LD_LIBRARY_PATH=$PWD/out/$b/lib:$LIBS timeout 100 out/dev/squeezekv bench --device cuda --dummy $C -r 3 "$@" 2>&1 |
    grep -E "^\| (tg|pp)|rror" >> $OUT/bench.txt; }
el "cuda_test dev"
LD_LIBRARY_PATH=$PWD/out/dev/lib:$LIBS timeout 120 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED" $OUT/cuda_test.txt | head -20
for r in 1 2 3; do
  echo "# round $r" >> $OUT/ops.txt; echo "# round $r" >> $OUT/bench.txt
  for b in base dev; do left 20 && ours $b -p 0 -n 32 -d 32768; done
  for b in base dev; do left 10 && ops $b --batch 1 --depths 32768; done
  [ $r = 3 ] && break
  for b in base dev; do left 25 && ours $b -p 0 -n 32 -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024 --kv-type q8_0; done
done
for b in dev base; do  # each kernel's duration under Nsight Compute (the op's first launches)
  left 40 || break
  echo "== $b" >> $OUT/ncu.txt
  LD_LIBRARY_PATH=$PWD/out/$b/lib:$LIBS timeout 60 ncu --clock-control none -k regex:"attn_merge|attn_decode_mma" -c 6 --metrics gpu__time_duration.sum \
    out/dev/squeezekv_bench_ops --device cuda --config $C --rounds 1 --filter "attn decode" --batch 1 --depths 32768 2>&1 |
    grep -E "k_attn|duration|rror" >> $OUT/ncu.txt
done
cat $OUT/ops.txt $OUT/bench.txt $OUT/ncu.txt 2>/dev/null
el done
