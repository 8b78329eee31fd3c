#!/usr/bin/env bash
# Llama-3.1-70B's shape in Q4_K_M on one GPU beside llama.cpp CUDA, in one device call (issue 28).
# llama.cpp's CUDA build comes from the llama-cpp-python 0.3.36 sdist (sm_90, the same nvcc),
# built on this project's machine (its llama-bench linked with -Wl,--allow-shlib-undefined where
# that machine has no libcuda) and carried as out/peer/llama.tar.xz beside out/peer/gguf-py;
# squeezekv's build as out/dev.tar.xz, its Debian libraries in out/sys/lib (the two builds fit
# the 64 MiB a call carries only as xz). bench/make_dummy_gguf.py --type Q4_K_M writes llama.cpp's
# 70B GGUF of random blocks with llama-quantize's tensor-type mix (the 141 GB BF16 source it would
# quantize does not fit that machine's disk) while squeezekv runs its first round on --dummy-type
# Q4_K_M (the same mix); then llama.cpp, squeezekv, llama.cpp alternate: prompt 512 and decode
# 128 at depth 0 and 8192, 2 repetitions each; last, squeezekv with squeeze 2048 at depth 32768.
# Each step after llama.cpp's first round runs only while LIMIT seconds (default 580) allow it.
#   OUT=DIR [LIMIT=S] bench/cuda/compare_70b.sh        (the device tool sets OUT)
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
tar xJf out/dev.tar.xz -C out && tar xJf out/peer/llama.tar.xz -C out/peer
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
LL=$PWD/out/peer/llama/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64${nccl:+:$nccl}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
g=/tmp/gguf
shm_free=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)
[ "${shm_free:-0}" -ge 46 ] && g=/dev/shm/gguf
mkdir -p $g; el "GGUF folder $g (/dev/shm free ${shm_free}G); nccl ${nccl:-none}" | tee $OUT/where.txt
( t0=$(date +%s); PYTHONPATH=out/peer/gguf-py timeout 400 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-70b.json $g/70b.Q4_K_M.gguf --type Q4_K_M > $OUT/gguf.txt 2>&1
  echo "gguf rc $? in $(( $(date +%s) - t0 )) s" >> $OUT/gguf.txt ) &
cfg=bench/configs/llama-3.1-70b.json
theirs() { el "llama.cpp round $1"; LD_LIBRARY_PATH=$LL timeout 150 out/peer/llama/bin/llama-bench -m $g/70b.Q4_K_M.gguf -ngl 99 -fa 1 -p 512 -n 128 -d 0,8192 -r 2 2>&1 | tee -a $OUT/llama_bench_raw.txt | grep -E "^\| |error|rror while" | tee -a $OUT/llama_bench.txt; }
ours() { el "squeezekv round $1"; timeout 150 out/dev/squeezekv bench --device cuda --dummy $cfg --dummy-type Q4_K_M -p 512 -n 128 -d 0,8192 -r 2 2>&1 | tee -a $OUT/squeezekv_bench_raw.txt | grep -E "^\| [pt]|model:|weights|error|rror while" | tee -a $OUT/squeezekv_bench.txt; }
ours 1
wait; cat $OUT/gguf.txt; ls -la $g
left() { [ $(( ${LIMIT:-580} - ($(date +%s) - T0) )) -ge "$1" ]; }
theirs 1
left 130 && ours 2
left 130 && theirs 2
if left 110; then
  el "squeezekv squeeze 2048 at depth 32768"
  timeout 110 out/dev/squeezekv bench --device cuda --dummy $cfg --dummy-type Q4_K_M -p 0 -n 128 -d 32768 -r 1 --kv-policy squeeze --kv-budget 2048 2>&1 | tee -a $OUT/squeezekv_squeeze_raw.txt | grep -E "^\| [pt]|error|rror while"
fi
el done
