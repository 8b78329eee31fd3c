#!/usr/bin/env bash
# The two device calls of bind.txt as one script (CPU only; carry out/dev.tar.xz and out/sys;
# the calls ran these lines inline). Rounds 1-2 at 16
# threads with none, close, spread, active; rounds 3-4 at 16 and 8 threads with none, active, close.
tar xJf out/dev.tar.xz -C out; export LD_LIBRARY_PATH=$PWD/out/dev/lib:$PWD/out/sys/lib:/usr/local/cuda/lib64
sq() { out/dev/squeezekv bench --dummy bench/configs/llama-3.2-1b.json --dummy-type Q8_0 -t "$1" -p 0 -n 64 -r 2; }
for r in 1 2; do for bind in none close spread active; do case $bind in
  none) sq 16 ;; active) OMP_WAIT_POLICY=active sq 16 ;; *) OMP_PROC_BIND=$bind OMP_PLACES=cores sq 16 ;;
  esac 2>&1 | grep -E "^\| tg|bandwidth" | sed "s/^/$r $bind /"; done; done
for r in 3 4; do for t in 16 8; do for bind in none active close; do case $bind in
  none) sq $t ;; active) OMP_WAIT_POLICY=active sq $t ;; *) OMP_PROC_BIND=$bind OMP_PLACES=cores sq $t ;;
  esac 2>&1 | grep -E "^\| tg" | sed "s/^/$r t$t $bind /"; done; done; done
