#!/usr/bin/env python3
"""Per-kernel totals from an ncu --csv file (gpu__time_duration.sum, dram__throughput):
    ncu --clock-control none --launch-skip 1200 --launch-count 560 \
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed --csv \
        build/squeezekv bench --dummy bench/configs/llama-3.1-8b.json --device cuda -p 0 -n 8 -r 1 --no-warmup > ncu.csv
    python3 bench/cuda/ncu_sum.py ncu.csv
"""
import csv, collections, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
h = rows[hdr]; ki = h.index('Kernel Name'); mi = h.index('Metric Name'); vi = h.index('Metric Value')
t = collections.defaultdict(float); n = collections.Counter(); bw = collections.defaultdict(list)
for r in rows[hdr + 1:]:
    name = r[ki].split('(')[0].split('<')[0][-40:]
    if r[mi] == 'gpu__time_duration.sum':
        t[name] += float(r[vi].replace(',', '')); n[name] += 1
    else:
        bw[name].append(float(r[vi].replace(',', '')))
for k in sorted(t, key=lambda k: -t[k]):
    print(f"{k:42s} n={n[k]:4d} total={t[k]/1e3:9.1f} us  mean={t[k]/n[k]/1e3:7.2f} us  dram%={sum(bw[k])/len(bw[k]):5.1f}")
print('sum us', sum(t.values()) / 1e3)
