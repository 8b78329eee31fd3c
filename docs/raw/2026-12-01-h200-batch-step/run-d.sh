#!/usr/bin/env bash
# The committed state (tensor-core decode attention, the CUDA cores' test held to f32 and the
# tensor cores' to their stated tolerance): cuda_test, then `squeezekv bench -b` (Llama-3.1-8B
# shape, bf16 dummy weights): depth 512 every batch size, depth 4096 128 sequences, full cache and
# squeeze 1024 (64 sequences: run-c.sh, the same code);
# the same steps on a 32-layer model of tiny matrices (the host's and the launches' floor); an
# Nsight Systems profile of 64 sequences at depth 512 where the machine has nsys.
set -u
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:/usr/local/cuda/lib64
echo "== cuda_test"; timeout 150 out/dev/cuda_test > $OUT/cuda_test_d.txt 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|differ from|Expected|Which is|decode attention" $OUT/cuda_test_d.txt | head -30
b() { echo "== $1"; timeout 150 out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json $1 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_batch_d.txt; }
b "-p 0 -n 32 -d 512 -r 3 -b 1,8,16,32,64,128,256"
b "-p 0 -n 16 -d 4096 -r 2 -b 128"
b "-p 0 -n 16 -d 4096 -r 2 -b 128 --kv-policy squeeze --kv-budget 1024"
# the host's and the launches' share: the same steps with matrices too small to take time
echo "== launch floor"; timeout 100 out/dev/squeezekv bench --device cuda --dummy bench/configs/launch-floor-32layer.json -p 0 -n 32 -d 512 -r 3 -b 1,8,64,256 2>&1 | grep -E "^\| (pp|tg)|rror" | tee -a $OUT/bench_batch_d.txt
# where a step of 64 sequences at depth 512 goes, if the machine has Nsight Systems
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "== nsys: ${NSYS:-none}"
if [ -n "$NSYS" ]; then
  timeout 80 $NSYS profile -o $OUT/b64 --force-overwrite true -t cuda --stats=false out/dev/squeezekv bench --device cuda --dummy bench/configs/llama-3.1-8b.json -p 0 -n 32 -d 512 -r 1 -b 64 > /dev/null 2>&1
  timeout 40 $NSYS stats -r cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum -f csv -o $OUT/b64 $OUT/b64.nsys-rep > /dev/null 2>&1
  rm -f $OUT/b64.nsys-rep $OUT/b64.sqlite; ls $OUT
fi
