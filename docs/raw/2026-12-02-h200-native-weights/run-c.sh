#!/usr/bin/env bash
# Native weights, third call: the packed GEMV in gemv.cu's launch shape (a block's 8 rows share
# each thread's activation loads; the parts of one type in one launch, RoPE and SwiGLU in its
# epilogue). cuda_test, then squeezekv bench of the 8B shape: one sequence per preset, and decode
# batches of 1-64 sequences at depth 512 with native and bf16 device weights, alternated.
set -u
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
cfg=bench/configs/llama-3.1-8b.json
SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared timeout 200 out/dev/cuda_test \
  --gtest_filter='*Packed*:*NativeWeight*:*Bf16Mode*:*ExactMode*:*FusedProducts*:*DecodeBatch*:*GraphReplay*:*CopiedSequence*' 2>&1 | tee $OUT/cuda_test.txt | grep -E "OK \]|FAILED|Failure|packed|native|Expected|Which|actual" | head -40
ours() {  # preset [extra flags]
  local t=$1; shift
  echo "== squeezekv $t $*"; timeout 100 out/dev/squeezekv bench --device cuda --dummy $cfg --dummy-type $t "$@" 2>&1 | grep -E "^\| [pt]|model:|error" | tee -a $OUT/squeezekv_bench.txt
}
for round in 1 2; do
  for t in Q4_K_M Q8_0 Q6_K Q4_0; do ours $t -p 512 -n 128 -r 3; done
done
for w in native bf16; do ours Q4_K_M --device-weights $w -p 0 -n 32 -d 512 -b 1,8,16,64 -r 2; done
