#!/usr/bin/env bash
# Issue 26's scorecard beside llama.cpp CUDA in one device call, every cell it names: one sequence
# (prompt 512 and decode at depth 0: `llama-bench -p 512 -n 64`; decode at depth 32768: `-p 0 -n 32
# -d 32768`), 64 sequences at 512 and at 4096 (`llama-batched-bench -pps -ntg 32 -npl 64`; ours
# the full cache at both and squeeze 1024 over q8_0 rows at 4096, against their full cache), and
# ours alone at 32768 under squeeze 2048 x 128 (7,000 tok/s on an H200; llama.cpp's best at that
# context, 24 full sequences, is a long run of its own: LLAMA_32K=1 adds it). Before the rounds,
# cuda_test and the server under a KV pool on the GPU (tests/serve_pool_test.py --device cuda: 64
# streams each generate's text, the pool's bounds, clients that leave). 8B shape, random BF16
# weights (ours --dummy, theirs bench/make_dummy_gguf.py's GGUF of the shape, written while the
# tests run); the engines alternate cell by cell, their order swapped each round; ROUNDS rounds
# (default 2) while LIMIT seconds (default 570) last; summary.txt puts each cell's ratio beside
# the issue's target.
# Carry (64 MiB at most): out/devsys.tar.xz (bench/cuda/stage_device.sh's dev/ and sys/, packed
# with `tar cJf out/devsys.tar.xz -C out dev sys`, ~10 MB), out/peer/gguf-py (`stage_device.sh
# --peer`) and out/peer/llama.tar.xz (bench/cuda/build_llamacpp_cuda.sh, built on this project's
# machine, ~41 MB: no compile time there) or else out/peer/llama-src.tar.xz (`stage_device.sh
# --peer`; then built there, ~350 s on 14 cores, while the tests run).
#   OUT=DIR [LIMIT=s] [ROUNDS=n] [LLAMA_32K=1] bash bench/cuda/scorecard.sh     (the device tool sets OUT)
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/steps.txt; }
left() { [ $(( ${LIMIT:-570} - ($(date +%s) - T0) )) -ge "$1" ]; }
for f in out/devsys.tar.xz out/peer/gguf-py; do
  [ -e $f ] || { echo "scorecard.sh: $f is missing (see this script's header)" >&2; exit 1; }
done
tar xJf out/devsys.tar.xz -C out
export SQUEEZEKV_TEST_SHARED=$PWD/out/dev/shared SQUEEZEKV_TEST_REF=$PWD/tests/ref
export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ -e out/peer/llama.tar.xz ]; then
  tar xJf out/peer/llama.tar.xz -C out/peer
  # built here against the NCCL it found (libnccl.so.2): there it comes with PyTorch's pip packages
  nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  LB=$PWD/out/peer/llama/bin LL=$PWD/out/peer/llama/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64${nccl:+:$nccl}
  echo "llama.cpp: carried (out/peer/llama.tar.xz); NCCL ${nccl:-not found}" > $OUT/llama_build_rc.txt
else
  [ -e out/peer/llama-src.tar.xz ] || { echo "scorecard.sh: out/peer has neither llama.tar.xz nor llama-src.tar.xz" >&2; exit 1; }
  LB=$PWD/out/peer/build/bin LL=$PWD/out/peer/build/bin:/usr/local/cuda/lib64
  mkdir -p out/peer/src && tar xJf out/peer/llama-src.tar.xz -C out/peer/src
  ( export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
    cmake -S out/peer/src/llama.cpp -B out/peer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF > /tmp/llama_build.txt 2>&1 &&
    timeout 420 cmake --build out/peer/build -j 14 --target llama-bench llama-batched-bench >> /tmp/llama_build.txt 2>&1
    echo "llama.cpp build rc $? in $(( $(date +%s) - t0 )) s" > $OUT/llama_build_rc.txt; tail -3 /tmp/llama_build.txt >> $OUT/llama_build_rc.txt ) &
fi
g=/dev/shm/gguf; mkdir -p $g
( PYTHONPATH=out/peer/gguf-py timeout 300 python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json $g/8b.BF16.gguf > $OUT/gguf.txt 2>&1
  echo "gguf rc $?" >> $OUT/gguf.txt ) &
C=bench/configs/llama-3.1-8b.json

el "cuda_test"
timeout 150 out/dev/cuda_test > $OUT/cuda_test.txt 2>&1; el "cuda_test rc $?"
grep -E "FAILED|PASSED" $OUT/cuda_test.txt | head -20
S=out/dev/shared/models
el "serve_pool_test --device cuda"
for m in "stories260k/stories260K.bin --tokenizer $S/stories260k/tok512.bin" "tinystories-656k"; do
  echo "== $m" >> $OUT/serve_pool.txt
  timeout 120 python3 tests/serve_pool_test.py out/dev/squeezekv -m $S/$m --device cuda -t 4 >> $OUT/serve_pool.txt 2>&1
  echo "rc $?" >> $OUT/serve_pool.txt
done
grep -E "^FAIL|^rc|passed" $OUT/serve_pool.txt
wait; cat $OUT/llama_build_rc.txt $OUT/gguf.txt

# one line a run in bench.txt: "CELL ENGINE | ..." (ours: bench's table row; theirs: its row)
ours() { local cell=$1; shift; el "$cell squeezekv $*"
  timeout 150 out/dev/squeezekv bench --device cuda --dummy $C -r 3 "$@" 2>&1 | grep -E "^\| (tg|pp)|rror" | sed "s|^|$cell squeezekv |" >> $OUT/bench.txt; }
bench1() { local cell=$1; shift; el "$cell llama-bench $*"
  LD_LIBRARY_PATH=$LL timeout 150 $LB/llama-bench -m $g/8b.BF16.gguf -ngl 99 -fa 1 -r 3 "$@" 2>&1 | grep -E "^\| .*(pp|tg)[0-9]|rror" |
    sed "s/^/$cell llama.cpp /" >> $OUT/bench.txt; }
batched() { local cell=$1; shift; el "$cell llama-batched-bench $*"
  LD_LIBRARY_PATH=$LL timeout 200 $LB/llama-batched-bench -m $g/8b.BF16.gguf -ngl 99 -fa on -pps -ntg 32 "$@" 2>&1 |
    grep -E "^\| +[0-9]|rror" | sed "s/^/$cell llama.cpp /" >> $OUT/bench.txt; }
cell() {  # name, our runs (;-separated LABEL:ARGUMENTS), their command and arguments; the order swapped each round
  local name=$1 mine=$2; shift 2
  local first=ours; [ $((r % 2)) = 0 ] && first=theirs
  for side in $first $([ $first = ours ] && echo theirs || echo ours); do
    if [ $side = ours ]; then
      IFS=';' read -ra runs <<< "$mine"
      for a in "${runs[@]}"; do left 30 && ours $name/${a%%:*} ${a#*:}; done
    elif [ $# -gt 0 ]; then
      left 60 && "$@"
    fi
  done
}
for r in $(seq 1 ${ROUNDS:-2}); do
  echo "# round $r" >> $OUT/bench.txt; el "round $r"
  cell one-d0 "full:-p 512 -n 64 -d 0" bench1 one-d0 -p 512 -n 64
  cell one-d32768 "full:-p 0 -n 32 -d 32768" bench1 one-d32768 -p 0 -n 32 -d 32768
  cell b64-d512 "full:-p 0 -n 32 -b 64 -d 512" batched b64-d512 -c 70000 -npp 512 -npl 64
  cell b64-d4096 "full:-p 0 -n 32 -b 64 -d 4096;squeeze1024-q8_0:-p 0 -n 32 -b 64 -d 4096 --kv-policy squeeze --kv-budget 1024 --kv-type q8_0" \
    batched b64-d4096 -c 266000 -npp 4096 -npl 64
  cell b128-d32768 "squeeze2048:-p 0 -n 32 -b 128 -d 32768 --kv-policy squeeze --kv-budget 2048"
done
[ "${LLAMA_32K:-0}" = 1 ] && left 200 && batched b24-d32768 -c 787200 -npp 32768 -npl 24
python3 bench/cuda/scorecard_summary.py $OUT/bench.txt | tee $OUT/summary.txt
el done
