#!/usr/bin/env python3
"""One table of the needle traces in this folder (run.sh's outputs): per layer and policy, the
share of (answer token, kv head) pairs held until the answer and their median rank, over the
samples each policy missed."""
import pathlib
import re

here = pathlib.Path(__file__).parent
policies = ["kvzip-adaptive", "kvzip", "h2o", "snapkv", "squeeze"]
rows, accuracy = {}, {}
for p in policies:
    text = (here / f"{p}.txt").read_text()
    accuracy[p] = float(re.search(r"accuracy=([\d.]+)", text).group(1))
    rows[p] = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([-\d.]+) \| ([-\d.]+) \|$", text, re.M)
print("| layer | " + " | ".join(f"{p} held / rank" for p in policies) + " |")
print("|---:|" + "---:|" * len(policies))
for i in range(len(rows[policies[0]])):
    print(f"| {i} | " + " | ".join(f"{float(rows[p][i][2]):.2f} / {rows[p][i][4]}" for p in policies) + " |")
print()
print("Answered: " + ", ".join(f"{p} {round(accuracy[p] * 10)}/10" for p in policies) + ".")
