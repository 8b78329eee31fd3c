"""Issue 26's scorecard from bench/cuda/scorecard.sh's bench.txt: each cell's figures round by round,
ours over llama.cpp's, beside the issue's target (tok/s; llama-batched-bench's S_TG; llama-bench's
mean).  Usage: scorecard_summary.py BENCH_TXT"""
import re
import statistics
import sys

# cell, our run's label, our test, their test (None: theirs is llama-batched-bench's S_TG), target
ROWS = [
    ("one-d0", "full", "pp512", "pp512", "prompt 512, one sequence: at least 1.2x"),
    ("one-d0", "full", "tg64", "tg64", "decode at depth 0, one sequence: not below 230 tok/s (an H200's figure)"),
    ("one-d32768", "full", "tg32", "tg32 @ d32768", "decode at depth 32768, one sequence, full cache: at least 1.1x"),
    ("b64-d512", "full", "tg32", None, "64 sequences at 512: at least 1.5x"),
    ("b64-d4096", "full", "tg32", None, "64 sequences at 4096, full cache: at least 1.2x"),
    ("b64-d4096", "squeeze1024-q8_0", "tg32", None, "64 at 4096 under squeeze 1024 (q8_0 rows) over their full cache: at least 2.5x"),
    ("b128-d32768", "squeeze2048", "tg32", None, "128 at 32768 under squeeze 2048: at least 7,000 tok/s (an H200's figure)"),
]


def parse(path):
    """{(round, cell, engine/label, test): tok/s}"""
    out, rnd = {}, 0
    for line in open(path):
        m = re.match(r"# round (\d+)", line)
        if m:
            rnd = int(m.group(1))
            continue
        m = re.match(r"(\S+) (squeezekv|llama\.cpp) (\|.*)", line.strip())
        if not m:
            continue
        cell, engine, row = m.groups()
        cols = [c.strip() for c in row.strip("|").split("|")]
        if engine == "squeezekv":
            test = cols[0].split(" @ ")[0]
            out[(rnd, cell.split("/")[0], "squeezekv/" + cell.split("/")[1], test)] = float(cols[1])
        elif len(cols) >= 8 and cols[0].isdigit():  # llama-batched-bench: PP TG B N_KV T_PP S_PP T_TG S_TG T S
            out[(rnd, cell, "llama.cpp", None)] = float(cols[7])
        else:  # llama-bench: ... | test | t/s (mean ± sd)
            out[(rnd, cell, "llama.cpp", cols[-2])] = float(cols[-1].split("±")[0])
    return out


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: scorecard_summary.py BENCH_TXT (bench/cuda/scorecard.sh's bench.txt)")
    try:
        r = parse(sys.argv[1])
    except OSError as e:
        raise SystemExit(f"scorecard_summary.py: cannot read {sys.argv[1]}: {e.strerror}")
    rounds = sorted({k[0] for k in r})
    print("| cell | target | " + " | ".join(f"round {i}: ours / llama.cpp (ratio)" for i in rounds) + " |")
    print("|---|---|" + "---:|" * len(rounds))
    for cell, label, ours_test, their_test, target in ROWS:
        cells = []
        for i in rounds:
            o = r.get((i, cell, "squeezekv/" + label, ours_test))
            t = r.get((i, cell, "llama.cpp", their_test))
            if t is None and their_test is None:
                t = r.get((i, cell, "llama.cpp", None))
            if o is None:
                cells.append("-")
            elif t is None:
                cells.append(f"{o:,.1f}")
            else:
                cells.append(f"{o:,.1f} / {t:,.1f} ({o / t:.2f}x)")
        print(f"| {cell} {label} {ours_test} | {target} | " + " | ".join(cells) + " |")
    ratios = {}
    for cell, label, ours_test, their_test, _ in ROWS:
        for i in rounds:
            o, t = r.get((i, cell, "squeezekv/" + label, ours_test)), r.get((i, cell, "llama.cpp", their_test))
            if o is not None and t is not None:
                ratios.setdefault(f"{cell} {label} {ours_test}", []).append(o / t)
    for k, v in ratios.items():
        print(f"{k}: median ratio {statistics.median(v):.2f}x over {len(v)} rounds")


if __name__ == "__main__":
    main()
