#!/usr/bin/env bash
# python_cuda.py again with the extension run-b.sh built for this machine's Python (in /tmp/pkg).
set -u
DEVLIB=$PWD/out/dev/lib:/usr/local/cuda/lib64
here=docs/raw/2026-12-02-h200-python-cuda
pkg=/tmp/pkg
if [ ! -f $pkg/squeezekv/model.py ]; then
  inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  suffix=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  mkdir -p $pkg/squeezekv
  g++ -std=c++20 -O2 -fPIC -shared -fvisibility=hidden -Iinclude -Itools -Iout/dev/inc -I$inc python/src/module.cc \
    out/dev/lib/libsqueezekv_eval.a -Lout/dev/lib -l:libsqueezekv.so.0 -Wl,-rpath,$PWD/out/dev/lib -o $pkg/squeezekv/_core$suffix
fi
cp python/squeezekv/*.py python/squeezekv/py.typed $pkg/squeezekv/
LD_LIBRARY_PATH=$DEVLIB PYTHONPATH=$pkg timeout 400 python3 $here/python_cuda.py $PWD/out/dev/shared/models $PWD/out/dev/squeezekv 2>&1 | tee $OUT/python_cuda.txt | tail -20
