#!/usr/bin/env bash
# Saved KV caches on the device (issue 30): the whole GPU suite (cuda_test; among it
# SavedCachesRestoreOnTheDeviceAndAcrossDevices), then a CLI round trip on CUDA: the 8B shape's
# dummy weights, a prompt saved with kvzip on the device, loaded under a longer prompt.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
DEVLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
echo "== cuda_test"; LD_LIBRARY_PATH=$DEVLIB timeout 300 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|Expected|Which is|rows: CPU-saved" $OUT/cuda_test.txt | head -30
E="--dummy bench/configs/llama-3.1-8b.json --device cuda"
doc=$(python3 -c "print(' '.join(['The quiet harbour town woke slowly under a grey sky.'] * 120))")
t0=$(date +%s.%N)
LD_LIBRARY_PATH=$DEVLIB out/dev/squeezekv generate $E -p "$doc" -n 0 --kv-policy kvzip --kv-budget 256 --save-kv /tmp/doc.kv 2>&1 | tail -2
ls -la /tmp/doc.kv
for i in 1 2; do
  LD_LIBRARY_PATH=$DEVLIB out/dev/squeezekv generate $E -p "$doc Where is the town?" -n 8 --temp 0 --kv-policy kvzip --kv-budget 256 --load-kv /tmp/doc.kv 2>&1 | tail -3
done
