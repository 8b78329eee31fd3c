#!/usr/bin/env python3
"""Per-kernel totals from an ncu --csv file, by kernel and grid: launches, total and mean
gpu__time_duration, and, where dram__bytes_read.sum was collected, MB read per launch and GB/s.
    ncu --csv --clock-control none --cache-control none --launch-skip 600 --launch-count 514 \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum \
        build/squeezekv bench --dummy bench/configs/llama-3.1-8b.json --device cuda --cuda-graphs off -p 0 -n 8 -r 1 > ncu.csv
    python3 bench/cuda/ncu_sum.py ncu.csv
(--clock-control none --cache-control none: the clocks and caches of a real run; by default ncu
locks the clocks and flushes the caches before every kernel, so small kernels read slow.)
"""
import csv, collections, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
h = rows[hdr]; ki = h.index('Kernel Name'); mi = h.index('Metric Name'); vi = h.index('Metric Value'); gi = h.index('Grid Size')
t = collections.defaultdict(float); n = collections.Counter(); by = collections.defaultdict(float)
for r in rows[hdr + 1:]:
    name = r[ki].split('(')[0][-48:] + ' ' + r[gi]
    v = float(r[vi].replace(',', ''))
    if r[mi] == 'gpu__time_duration.sum':
        t[name] += v; n[name] += 1
    elif r[mi] == 'dram__bytes_read.sum':
        by[name] += v
for k in sorted(t, key=lambda k: -t[k]):
    line = f"{k:64s} n={n[k]:4d} total={t[k] / 1e3:9.1f} us  mean={t[k] / n[k] / 1e3:7.2f} us"
    if k in by:
        line += f"  read={by[k] / n[k] / 1e6:8.2f} MB/launch  {by[k] / t[k]:7.1f} GB/s"
    print(line)
print('sum us', sum(t.values()) / 1e3)
