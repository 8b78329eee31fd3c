"""The table of bench/cpu_threads.sh's results: per file, thread count and test, the median over
the rounds of squeezekv's and llama.cpp's tokens/s and their ratio (markdown).
  python3 bench/cpu_threads_report.py OUT
"""
import glob
import json
import os
import re
import statistics
import sys
from collections import defaultdict


def main():
    out = sys.argv[1]
    runs = defaultdict(lambda: {"sq": [], "ll": []})  # (file, threads, test) -> engine -> [tok/s]
    for path in glob.glob(os.path.join(out, "*.json")):
        m = re.match(r"(sq|ll)_(.+)_t(\d+)_d(\d+)_r\d+\.json$", os.path.basename(path))
        if not m:
            continue
        engine, name, t, d = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
        try:
            data = json.load(open(path))
        except (ValueError, OSError):
            continue
        if engine == "sq":
            for test in data.get("tests", []):
                if test["tokens"] > 0:
                    runs[(name, t, f"{test['test']}{test['tokens']} @ d{test['depth']}")][engine].append(test["median"])
        else:
            for rec in data:
                kind = "pp" if rec["n_prompt"] > 0 else "tg"
                n = rec["n_prompt"] if kind == "pp" else rec["n_gen"]
                runs[(name, t, f"{kind}{n} @ d{rec.get('n_depth', 0)}")][engine].append(rec["avg_ts"])
    print("| file | threads | test | squeezekv tok/s | llama.cpp tok/s | ratio | rounds |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for (name, t, test) in sorted(runs, key=lambda k: (k[0], k[2], k[1])):
        r = runs[(name, t, test)]
        if not r["sq"] or not r["ll"]:
            print(f"| {name} | {t} | {test} | {r['sq']} | {r['ll']} | - | - |")
            continue
        a, b = statistics.median(r["sq"]), statistics.median(r["ll"])
        print(f"| {name} | {t} | {test} | {a:,.1f} | {b:,.1f} | {a / b:.2f}x | {min(len(r['sq']), len(r['ll']))} |")


if __name__ == "__main__":
    main()
