"""Aggregate generation speed of `squeezekv serve` with 1, 4 and 8 concurrent streams.

Starts the server (--parallel = the most streams asked for), then for each concurrency c runs
c streamed chat requests at once, each for --tokens tokens (greedy, prompts that do not end
early: ignored when they do, the count is what the server reports), several rounds; prints the
median aggregate tokens/s (all generated tokens / wall time from the first request to the last
token), per-stream tokens/s, and the ratio to one stream. Needs the `openai` package.
  python3 bench/bench_server.py --bin build/squeezekv --streams 1,4,8 --tokens 128 --rounds 3 -t 2 [-- extra serve flags]
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time

import openai

PROMPTS = ["Write a long story about a lighthouse keeper and a storm.", "Explain how a steam engine works, step by step.",
           "Describe a walk through a busy market in detail.", "Write a letter to a friend about a journey by train.",
           "Tell the history of a small fishing village.", "Describe the life cycle of a butterfly at length.",
           "Write a detailed recipe for bread, with every step.", "Describe a chess game move by move."]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/squeezekv")
    ap.add_argument("--streams", default="1,4,8")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("extra", nargs="*", help="more serve flags (after --)")
    a = ap.parse_args()
    streams = [int(s) for s in a.streams.split(",")]
    cmd = [a.bin, "serve", "--port", "0", "-t", str(a.threads), "--parallel", str(max(streams)), *a.extra]
    srv = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = srv.stdout.readline()
    url = re.search(r"(http://[\d.]+:\d+)", line).group(1)
    print(line.strip(), file=sys.stderr)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)

    def one(i, out):
        t0 = time.time()
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                           max_tokens=a.tokens, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        n = 0
        for c in r:
            if c.usage is not None:
                n = c.usage.completion_tokens
        out[i] = (n, t0, time.time())

    one(0, [None])  # warm-up
    rows = []
    try:
        for c in streams:
            agg, per = [], []
            for _ in range(a.rounds):
                out = [None] * c
                ts = [threading.Thread(target=one, args=(i, out)) for i in range(c)]
                t0 = time.time()
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                wall = max(o[2] for o in out) - t0
                total = sum(o[0] for o in out)
                agg.append(total / wall)
                per.append(statistics.median(o[0] / (o[2] - o[1]) for o in out))
            rows.append({"streams": c, "aggregate_tok_s": statistics.median(agg), "per_stream_tok_s": statistics.median(per),
                         "aggregate_runs": agg})
    finally:
        srv.terminate()
        srv.wait()
    base = rows[0]["aggregate_tok_s"]
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, -t {a.threads}, {a.tokens} tokens per stream, "
          f"median of {a.rounds} rounds; serve flags: {' '.join(a.extra) or '(defaults)'}")
    print("| streams | aggregate tok/s | per-stream tok/s | vs 1 stream |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['streams']} | {r['aggregate_tok_s']:.1f} | {r['per_stream_tok_s']:.1f} | {r['aggregate_tok_s'] / base:.2f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": sys.argv, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
