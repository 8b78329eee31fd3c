#!/usr/bin/env python3
"""Turns sweep records (JSON lines from `squeezekv eval sweep`) into PNG charts: perplexity vs KV
budget per length (one line per policy, the full cache as a horizontal reference); for accuracy
tasks one heat map per task (a panel per length, policies x budgets, each cell annotated, since
accuracies of a few samples take few values and lines would hide each other); and the per-layer
budgets squeeze chose.

    python3 scripts/plot_sweep.py docs/results/sweep_smollm2.jsonl --out docs/results
Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: E402


def load(paths):
    recs = {}
    for p in paths:
        with open(p) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    recs[r["key"]] = r  # a later file wins for the same run
    return list(recs.values())


def save(fig, out_dir, name):
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(fig)
    return name


def label_of(task, ctx):
    return f"{task} @ {ctx} tokens"


def plot_accuracy(recs, out_dir):
    by_task = defaultdict(list)
    for r in recs:
        if r["metric"] != "ppl":
            by_task[r["task"]].append(r)
    files = []
    for task, rs in sorted(by_task.items()):
        ctxs = sorted({r["ctx"] for r in rs})
        fracs = sorted({r["budget_fraction"] for r in rs if r["policy"] != "full"})
        pols = ["full"] + sorted({r["policy"] for r in rs if r["policy"] != "full"})
        cell = {(r["ctx"], r["policy"], r["budget_fraction"]): r["value"] for r in rs}
        fig, axes = plt.subplots(1, len(ctxs), figsize=(1.2 + 2.1 * len(ctxs), 0.9 + 0.32 * len(pols)),
                                 sharey=True, squeeze=False)
        for ax, ctx in zip(axes[0], ctxs):
            grid = []
            for p in pols:
                row = []
                for f in fracs:
                    v = cell.get((ctx, p, 1.0 if p == "full" else f))
                    row.append(float("nan") if v is None else v)
                grid.append(row)
            ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
            for i, row in enumerate(grid):
                for j, v in enumerate(row):
                    txt = "–" if v != v else f"{v:.2f}"
                    ax.text(j, i, txt, ha="center", va="center", fontsize=7,
                            color="gray" if v != v else ("white" if v < 0.5 else "black"))
            ax.set_xticks(range(len(fracs)))
            ax.set_xticklabels([f"{100 * f:g}%" for f in fracs], fontsize=7)
            ax.set_title(f"{ctx} tokens", fontsize=9)
            ax.set_xlabel("budget", fontsize=8)
        axes[0][0].set_yticks(range(len(pols)))
        axes[0][0].set_yticklabels(pols, fontsize=7)
        fig.suptitle(f"{task}: exact-match accuracy (full cache: its whole context)", fontsize=10)
        files.append(save(fig, out_dir, f"{task}_accuracy.png"))
    return files


def plot_metric(recs, out_dir):
    groups = defaultdict(list)
    for r in recs:
        if r["metric"] == "ppl":
            groups[(r["task"], r["ctx"])].append(r)
    files = []
    for (task, ctx), rs in sorted(groups.items()):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        full = [r for r in rs if r["policy"] == "full"]
        by_policy = defaultdict(list)
        for r in rs:
            if r["policy"] != "full":
                by_policy[r["policy"]].append(r)
        markers = "osD^v<>pXh*"
        for i, (pol, prs) in enumerate(sorted(by_policy.items())):
            prs.sort(key=lambda r: r["budget_fraction"])
            ls = "-" if pol.startswith("squeeze") else "--"
            ax.plot([100 * r["budget_fraction"] for r in prs], [r["value"] for r in prs], ls=ls,
                    marker=markers[i % len(markers)], label=pol, ms=5, alpha=0.85)
        if full:
            ax.axhline(full[0]["value"], color="black", lw=1.2, ls=":", label="full cache")
        metric = rs[0]["metric"]
        ax.set_xscale("log")
        ticks = sorted({100 * r["budget_fraction"] for r in rs if r["policy"] != "full"})
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:g}%" for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("KV budget per layer (% of context)")
        ax.set_ylabel("perplexity (lower is better)" if metric == "ppl" else "exact-match accuracy")
        if metric == "ppl":
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(ScalarFormatter())
        else:
            ax.set_ylim(-0.05, 1.05)
        ax.set_title(label_of(task, ctx))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        files.append(save(fig, out_dir, f"{task}_{ctx}.png"))
    return files


def plot_layer_budgets(recs, out_dir, fraction=0.1):
    sq = [r for r in recs if r["kv_policy"] == "squeeze" and abs(r["budget_fraction"] - fraction) < 1e-9 and r.get("layer_budgets")]
    if not sq:
        return None
    # one representative run per metric: the perplexity run when there is one
    pick = {}
    for r in sorted(sq, key=lambda r: (r["task"] != "ppl", r["ctx"])):
        pick.setdefault(r["policy"], r)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for pol, r in sorted(pick.items()):
        b = r["layer_budgets"]
        ax.plot(range(len(b)), b, "-o", ms=3, label=f"{pol} ({r['task']} @ {r['ctx']})")
    any_r = next(iter(pick.values()))
    ax.axhline(any_r["budget"], color="black", ls=":", lw=1.2, label=f"uniform ({any_r['budget']})")
    ax.set_xlabel("layer")
    ax.set_ylabel("tokens kept (budget)")
    ax.set_title(f"squeeze: per-layer budgets at {100 * fraction:g}% of context")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, out_dir, "squeeze_layer_budgets.png")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("records", nargs="+")
    ap.add_argument("--out", default="docs/results")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    recs = load(a.records)
    files = plot_metric(recs, a.out) + plot_accuracy(recs, a.out)
    lb = plot_layer_budgets(recs, a.out)
    for f in files + ([lb] if lb else []):
        print(os.path.join(a.out, f))


if __name__ == "__main__":
    main()
