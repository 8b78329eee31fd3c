#!/usr/bin/env python3
"""docs/RESULTS.md from the committed sweep config (bench/sweep_smollm2.json).

    # 1. run the sweep (resumable; one JSON line per run)
    ./build/squeezekv eval sweep --config bench/sweep_smollm2.json -t 2
    #    or split it over N processes: shard configs, run each, records land in docs/results/
    python3 scripts/make_results.py shard --config bench/sweep_smollm2.json --shards 8 --dir /tmp/shards --name r2-
    #    (a shard skips runs that any records file of the sweep already holds)
    # 2. charts + tables + who wins where
    python3 scripts/make_results.py report --config bench/sweep_smollm2.json --machine "..."
    #    (with the records of --windows-config, default bench/sweep_smollm2_ppl_windows.json, the
    #    perplexity cells again over several windows per text: run that sweep the same way)

The report reads every records file the config (or its shards) wrote; numbers are deterministic
for a given binary (greedy decoding, fixed seeds, thread-count-independent kernels).
"""
import argparse
import glob
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def shard(a):
    cfg = json.load(open(a.config))
    os.makedirs(a.dir, exist_ok=True)
    base, ext = os.path.splitext(cfg["output"])
    # every records file of this sweep so far: a shard skips the runs any of them holds
    done = sorted(glob.glob(f"{base}*{ext}"))
    pols = cfg["policies"]
    fr = cfg["budget_fractions"]
    units = [(p, f) for p in pols for f in fr]
    for i in range(a.shards):
        mine = units[i::a.shards]
        if not mine:
            continue
        # a shard takes whole (policy, fraction) pairs; policies with the same fractions share one
        # config, so the shard walks task by task over all of them; shard 0 also runs the full cache
        by_pol = defaultdict(list)
        for p, f in mine:
            by_pol[json.dumps(p, sort_keys=True)].append(f)
        by_fracs = defaultdict(list)
        for pk, fs in by_pol.items():
            by_fracs[tuple(fs)].append(json.loads(pk))
        for j, (fs, ps) in enumerate(sorted(by_fracs.items())):
            c = dict(cfg)
            c["policies"] = [p for p in pols if p in ps]
            c["budget_fractions"] = list(fs)
            c["include_full"] = i == 0 and j == 0
            c["output"] = f"{base}.{a.name}{i}-{j}{ext}"
            c["done_records"] = [d for d in done if d != c["output"]]
            path = os.path.join(a.dir, f"shard{i}-{j}.json")
            json.dump(c, open(path, "w"), indent=1)
            print(path)


def fmt(metric, v):
    return f"{v:.2f}" if metric == "ppl" else f"{v:.2f}"


def wilson(k, n, z=1.96):
    """95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / d
    return (max(0.0, c - h), min(1.0, c + h))


def cell(r):
    """A table cell: the value, and for accuracy with a sample count its 95% interval."""
    if r["metric"] == "ppl" or "n_samples" not in r:
        return fmt(r["metric"], r["value"])
    lo, hi = wilson(r["n_correct"], r["n_samples"])
    return f"{r['value']:.2f} [{lo:.2f}, {hi:.2f}]"


def targets(recs):
    """The issue's must-hold figures, computed from the records (10% / 20% / 40% budgets)."""
    out = ["## The issues' target lines", ""]
    ppl = [r for r in recs if r["metric"] == "ppl"]
    for task, ctx in sorted({(r["task"], r["ctx"]) for r in ppl}):
        g = {(r["policy"], r["budget_fraction"]): r["value"] for r in ppl if r["task"] == task and r["ctx"] == ctx}
        full, sq, h2o = g.get(("full", 1.0)), g.get(("squeeze", 0.1)), g.get(("h2o", 0.1))
        if None in (full, sq, h2o):
            continue
        ok = sq <= h2o and sq <= 1.10 * full
        best_v, best_p = min((v, p) for (p, f), v in g.items() if f == 0.1)
        out.append(f"- {task} {ctx}, 10% KV: squeeze {sq:.3f} ({sq / full:.3f}x full {full:.3f}), h2o {h2o:.3f} "
                   f"({h2o / full:.3f}x): squeeze {'at or below' if sq <= h2o else 'ABOVE'} h2o, "
                   f"{'within' if sq <= 1.10 * full else 'OUTSIDE'} 1.10x full -> {'met' if ok else 'NOT met'} "
                   f"(best of all policies here: {best_p} {best_v:.3f}, {best_v / full:.3f}x).")
    acc = [r for r in recs if r["metric"] == "accuracy"]
    for task, ctx, f, need in [("passkey", 2048, 0.2, 0.8), ("passkey-4k", 4096, 0.2, 0.8), ("passkey-question-aware", 2048, 0.4, 0.9)]:
        g = [r for r in acc if r["task"] == task and r["ctx"] == ctx]
        full = next((r["value"] for r in g if r["policy"] == "full"), None)
        cand = sorted(((r["value"], r["policy"]) for r in g if r["budget_fraction"] == f), reverse=True)
        if full is None or not cand:
            continue
        best_v, best_p = cand[0]
        ok = full > 0 and best_v >= need * full
        out.append(f"- {task} {ctx}, {100 * f:g}% KV: best {best_p} {best_v:.2f} vs full {full:.2f} "
                   f"({best_v / full if full else 0:.2f}x; needs {need}x) -> {'met' if ok else 'NOT met'}.")
    out.append("")
    return out


def findings(recs, cfg, labels, fr):
    """Plain statements computed from the records."""
    out = ["## What the numbers say", ""]
    ppl = [r for r in recs if r["metric"] == "ppl"]
    for task, ctx in sorted({(r["task"], r["ctx"]) for r in ppl}):
        full = next((r for r in ppl if r["task"] == task and r["ctx"] == ctx and r["policy"] == "full"), None)
        if not full:
            continue
        for f in fr:
            cells = [(r["value"], r["policy"], r["kept_bytes"]) for r in ppl
                     if r["task"] == task and r["ctx"] == ctx and r["budget_fraction"] == f]
            if not cells:
                continue
            best, worst = min(cells), max(cells)
            ties = [p for v, p, _ in cells if v == best[0]]
            win = next((v for v, p, _ in cells if p == "window"), None)
            h2o = next((v for v, p, _ in cells if p == "h2o"), None)
            extra = ""
            if win is not None:
                extra += f"; window (StreamingLLM) +{100 * (win / full['value'] - 1):.1f}%"
            if h2o is not None:
                extra += f"; h2o +{100 * (h2o / full['value'] - 1):.1f}%"
            out.append(f"- {task} at {ctx} tokens, {100 * f:g}% budget ({best[2] / 1e6:.1f} MB kept of "
                       f"{full['kept_bytes'] / 1e6:.1f} MB): best **{', '.join(ties)}** {best[0]:.2f}, "
                       f"+{100 * (best[0] / full['value'] - 1):.1f}% over the full cache ({full['value']:.2f}){extra}; "
                       f"worst {worst[1]} {worst[0]:.2f}.")
    ret = [r for r in recs if r["metric"] == "accuracy"]
    for qa in (False, True):
        sub = [r for r in ret if bool(r.get("question_aware")) == qa]
        if not sub:
            continue
        by_pol = defaultdict(list)
        for r in sub:
            by_pol[r["policy"]].append(r["value"])
        means = sorted(((sum(v) / len(v), p) for p, v in by_pol.items()), reverse=True)
        lengths = ", ".join(str(c) for c in sorted({r["ctx"] for r in sub}))
        if not qa:
            out.append(f"- Retrieval with the context compressed before the question ({lengths} tokens), mean "
                       "accuracy over every length, depth and budget: " + ", ".join(f"{p} {m:.2f}" for m, p in means) +
                       ". A needle survives only if it drew attention before the question or sits in the protected "
                       "recent window.")
        else:
            out.append(f"- Retrieval with the question in the prompt ({lengths} tokens), mean accuracy over every "
                       "depth and budget: " + ", ".join(f"{p} {m:.2f}" for m, p in means) + ".")
        by_len = defaultdict(list)
        for r in sub:
            if r["policy"] != "full":
                by_len[r["ctx"]].append(r["value"])
        hits = defaultdict(float)
        for r in sub:
            if r["policy"] != "full":
                for d in r.get("by_depth", []):
                    hits[d["depth"]] += d["accuracy"]
        if sum(hits.values()) > 0:
            out.append("  Where the evicting policies' hits were, by needle depth (samples answered, all policies, "
                       "budgets and lengths): " + ", ".join(f"{d:g}: {h:g}" for d, h in sorted(hits.items())) +
                       ". A needle deep in the context is one the recent window protects.")
        full_by = defaultdict(list)
        for r in sub:
            if r["policy"] == "full":
                full_by[r["ctx"]].append(r["value"])
        full_len = {c: sum(v) / len(v) for c, v in full_by.items()}
        if len(by_len) > 1:
            out.append("  By length (mean over tasks, depths, and for the evicting policies every policy and budget), "
                       "full cache vs evicting: " +
                       "; ".join(f"{c}: {full_len.get(c, float('nan')):.2f} vs {sum(v) / len(v):.2f}"
                                 for c, v in sorted(by_len.items())) + ".")
    over = []
    for r in recs:
        if r.get("kv_policy") == "squeeze" and r.get("layer_budgets"):
            m = max(r["layer_budgets"])
            if m > r["ctx"]:
                over.append((r["policy"], r["task"], r["ctx"], r["budget_fraction"], m, r["layer_budgets"].index(m)))
    if over:
        pols = sorted({o[0] for o in over})
        o = max(over, key=lambda o: o[4])
        out.append(f"- {', '.join(pols)}: some layers were given more tokens than the context holds (e.g. layer {o[5]} "
                   f"got {o[4]} at {o[1]} {o[2]}, {100 * o[3]:g}%), so the budget they do not use is lost to the "
                   "others: the rows that run with `squeeze_cap off` (the cap at the tokens a layer holds, with the "
                   "excess handed on, is on by default).")
    out.append("")
    return out


def describe(policies):
    """One line naming what each policy row of a config sets beyond its policy's defaults."""
    parts = []
    for p in policies:
        extra = ", ".join(f"{k} {v}" for k, v in p.items() if k not in ("label", "kv_policy"))
        lab = p.get("label", p["kv_policy"])
        parts.append(f"`{lab}` ({p['kv_policy']}{', ' + extra if extra else ', its defaults'})")
    return "Rows: " + "; ".join(parts) + "."


def sweep_records(path):
    """(config, records) of a second sweep's config at path: every records file it (or its
    shards) wrote, a later file winning for the same run; None without the config or records."""
    if not path or not os.path.exists(path):
        return None
    import plot_sweep  # the records' reader

    cfg = json.load(open(path))
    base, ext = os.path.splitext(cfg["output"])
    recs = plot_sweep.load(sorted(set(glob.glob(base + "*" + ext))))
    return (cfg, recs) if recs else None


def windows_section(path):
    """The perplexity targets again over several windows per text (a second, smaller sweep: its
    config, e.g. bench/sweep_smollm2_ppl_windows.json). One window's perplexity under eviction
    moves by ~1% when only the order of floating-point operations changes (kernels between
    sessions), which is more than the squeeze / h2o margins in the main tables."""
    found = sweep_records(path)
    if not found:
        return []
    cfg, recs = found
    base, ext = os.path.splitext(cfg["output"])
    labels = [p.get("label", p["kv_policy"]) for p in cfg["policies"]]
    cells = sorted({(r["task"], r["ctx"]) for r in recs})
    g = {(r["task"], r["ctx"], r["policy"]): r for r in recs}
    wins = sorted({len(r.get("window_ppl", [])) for r in recs})
    commits = sorted({r.get("git_commit", "?") for r in recs})
    fr = cfg["budget_fractions"]
    out = [f"## Perplexity over {', '.join(map(str, wins))} windows per text ({', '.join(f'{100 * f:g}%' for f in fr)} KV)", "",
           f"Config `{path}` (records `{os.path.relpath(base)}*{ext}`, engine commit(s) {', '.join(commits)}): the "
           "same protocol as above over consecutive windows of each text; a cell is the perplexity over all the "
           "windows' scored tokens (exp of their mean negative log-likelihood), with its ratio to the full "
           "cache's. " + describe(cfg["policies"]), "",
           "| policy | " + " | ".join(f"{t} {c}" for t, c in cells) + " |", "|---|" + "---|" * len(cells)]
    for lab in ["full"] + labels:
        row = []
        for t, c in cells:
            r, full = g.get((t, c, lab)), g.get((t, c, "full"))
            row.append("–" if r is None else f"{r['value']:.3f}" + (f" ({r['value'] / full['value']:.3f}x)" if full and lab != "full" else ""))
        out.append(f"| {lab} | " + " | ".join(row) + " |")
    out.append("")
    for t, c in cells:
        full, h2o, sq = (g.get((t, c, k)) for k in ("full", "h2o", "squeeze"))
        if None in (full, h2o, sq):
            continue
        sqs = sorted((g[(t, c, lab)]["value"], lab) for lab in labels if lab.startswith("squeeze") and (t, c, lab) in g)
        best_v, best_lab = min((g[(t, c, lab)]["value"], lab) for lab in labels if (t, c, lab) in g)
        below = sum(a <= b for a, b in zip(sq.get("window_ppl", []), h2o.get("window_ppl", [])))
        out.append(f"- {t} {c}: squeeze {sq['value']:.3f} vs h2o {h2o['value']:.3f} "
                   f"({100 * (sq['value'] - h2o['value']) / h2o['value']:+.2f}%; at or below h2o in {below} of "
                   f"{len(sq.get('window_ppl', []))} windows), {sq['value'] / full['value']:.3f}x full; "
                   f"squeeze settings from best: {', '.join(f'{lab} {v:.3f}' for v, lab in sqs)}; best of all here: "
                   f"{best_lab} {best_v:.3f} ({best_v / full['value']:.3f}x).")
    both = [(g[(t, c, "squeeze")]["value"], g[(t, c, "h2o")]["value"], g[(t, c, "full")]["value"]) for t, c in cells
            if all((t, c, k) in g for k in ("squeeze", "h2o", "full"))]
    if both:
        out.append(f"- In all: squeeze at its default at or below h2o in {sum(s <= h for s, h, _ in both)} of {len(both)} "
                   f"cells, within 1.10x the full cache in {sum(s <= 1.10 * f for s, _, f in both)} (h2o: "
                   f"{sum(h <= 1.10 * f for _, h, f in both)}); the best squeeze setting of each cell against h2o: "
                   + ", ".join(f"{100 * (v - g[(t, c, 'h2o')]['value']) / g[(t, c, 'h2o')]['value']:+.2f}%"
                               for t, c in cells if (t, c, "h2o") in g
                               for v in [min(g[(t, c, lab)]["value"] for lab in labels
                                             if lab.startswith("squeeze") and (t, c, lab) in g)]) + ".")
    out.append("")
    return out


def kv_types_sweep(path, want_ppl):
    """A sweep with a kv_types axis at path, its perplexity records (want_ppl) or its others (a
    records file of another sweep may share the name's start): (cfg, base, ext, types, labels,
    budget fractions, records by (task, ctx, policy without its @type, fraction, row types),
    engine commits), or None without such records."""
    found = sweep_records(path)
    if not found or "kv_types" not in found[0]:
        return None
    cfg, recs = found
    recs = [r for r in recs if (r.get("metric") == "ppl") == want_ppl]
    if not recs:
        return None

    def type_of(r):  # as kv_types names it: "q8_0", "q8_0/q4_1", "q4_1+r32" (the newest rows also in f16)
        t = r["kv_type"] if r["kv_type"] == r["kv_type_v"] else f"{r['kv_type']}/{r['kv_type_v']}"
        return t + (f"+r{r['kv_recent_f16']}" if r.get("kv_recent_f16") else "")

    base, ext = os.path.splitext(cfg["output"])
    labels = ["full"] + [p.get("label", p["kv_policy"]) for p in cfg["policies"]]
    g = {(r["task"], r["ctx"], r["policy"].split("@")[0], r["budget_fraction"], type_of(r)): r for r in recs}
    commits = sorted({r.get("git_commit", "?") for r in recs})
    return cfg, base, ext, cfg["kv_types"], labels, sorted(cfg["budget_fractions"]), g, commits


def kv_types_section(path, doc_dir):
    """Quality against the bytes kept, every (policy, budget, KV row type) of a sweep with a
    kv_types axis (e.g. bench/sweep_smollm2_kv_types.json): the table, and a chart of perplexity
    against kept bytes with the frontier (the points no other point beats on both)."""
    sweep = kv_types_sweep(path, want_ppl=True)
    if sweep is None:
        return []
    cfg, base, ext, types, labels, fr, g, commits = sweep
    cells = sorted({(k[0], k[1]) for k in g})
    out_dir = os.path.dirname(cfg["output"]) or "."
    out = ["## Quality per byte with quantized KV rows", "",
           f"Config `{path}` (records `{os.path.relpath(base)}*{ext}`, engine commit(s) {', '.join(commits)}): every "
           f"policy at {', '.join(f'{100 * f:g}%' for f in fr)} of the tokens and the full cache, each with K and V "
           f"rows of {', '.join(f'`{t}`' for t in types)} (K/V where they differ; blocks of 32 with their own scales, "
           "4-bit keys rotated; +rN: the newest N rows also kept in f16, `--kv-recent-f16 N`, their bytes counted: "
           "docs/DESIGN.md). A cell: perplexity (its ratio to the full f16 cache) and the MB of "
           "K and V kept at the end; the chart puts every point at its kept bytes, the frontier joining those "
           "that no other point beats on both.", ""]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    for task, ctx in cells:
        full = g.get((task, ctx, "full", 1.0, "f16"))
        out += [f"{task}, {ctx} tokens:", "", "| policy | share | " + " | ".join(types) + " |", "|---|---|" + "---|" * len(types)]
        pts = []
        for lab in labels:
            for f in ([1.0] if lab == "full" else fr):
                row = []
                for t in types:
                    r = g.get((task, ctx, lab, f, t))
                    if r is None:
                        row.append("–")
                        continue
                    mb = r["kept_bytes"] / 1e6
                    ratio = f" ({r['value'] / full['value']:.3f}x)" if full else ""
                    row.append(f"{r['value']:.2f}{ratio}, {mb:.1f} MB")
                    pts.append((mb, r["value"], lab, t, f))
                out.append(f"| {lab} | {100 * f:g}% | " + " | ".join(row) + " |")
        out.append("")
        front = []
        for p in sorted(pts):
            if not front or p[1] < front[-1][1]:
                front.append(p)
        out.append("Frontier (fewest bytes for each step down in perplexity): " +
                   ", ".join(f"{lab} {100 * f:g}% {t} {v:.2f} at {mb:.1f} MB" for mb, v, lab, t, f in front) + ".")
        out.append("")
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        markers = dict(zip(labels, "ovs^Dpx*"))
        colors = dict(zip(types, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
        for mb, v, lab, t, f in pts:
            ax.scatter(mb, v, marker=markers.get(lab, "o"), color=colors[t], s=36)
        ax.plot([p[0] for p in front], [p[1] for p in front], color="0.6", lw=1, zorder=0)
        for lab in labels:
            ax.scatter([], [], marker=markers.get(lab, "o"), color="0.3", label=lab)
        for t in types:
            ax.plot([], [], color=colors[t], lw=6, label=t)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.set_xlabel("K and V kept (MB, log scale)")
        ax.set_ylabel("perplexity")
        ax.set_title(f"{task}, {ctx} tokens: perplexity against KV bytes")
        ax.legend(fontsize=7, ncol=2)
        name = f"{task}_{ctx}_ppl_vs_bytes.png"
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        out += [f"![{name}]({os.path.relpath(os.path.join(out_dir, name), doc_dir)})", ""]
    return out


def kv_types_retrieval_section(path):
    """Retrieval with quantized KV rows (a sweep with a kv_types axis over retrieval tasks, e.g.
    bench/sweep_smollm2_kv_types_passkey.json): accuracy and kept bytes for every (task, policy,
    budget) under each row type."""
    sweep = kv_types_sweep(path, want_ppl=False)
    if sweep is None:
        return []
    cfg, base, ext, types, labels, fr, g, commits = sweep
    out = ["## Retrieval with quantized KV rows", "",
           f"Config `{path}` (records `{os.path.relpath(base)}*{ext}`, engine commit(s) {', '.join(commits)}): each "
           f"retrieval task with K and V rows of {', '.join(f'`{t}`' for t in types)} (as in the section above), the "
           "context compressed before the question. A cell: accuracy (correct of samples) and the MB of K and V kept.",
           "", "| task | policy | share | " + " | ".join(types) + " |", "|---|---|---|" + "---|" * len(types)]
    for task, ctx in sorted({(k[0], k[1]) for k in g}):
        for lab in labels:
            for f in ([1.0] if lab == "full" else fr):
                row = []
                for t in types:
                    r = g.get((task, ctx, lab, f, t))
                    row.append("–" if r is None else f"{r['n_correct']}/{r['n_samples']}, {r['kept_bytes'] / 1e6:.1f} MB")
                out.append(f"| {task} {ctx} | {lab} | {100 * f:g}% | " + " | ".join(row) + " |")
    out.append("")
    return out


def kvzip_heads_section(path):
    """kvzip's two splits of a layer's budget over its kv heads on real text (e.g.
    bench/sweep_smollm2_kvzip_heads.json): the same count in every head, or KVzip's own bottom-k
    over all of a layer's heads; accuracy with 95% intervals, perplexity, per task and budget."""
    return policy_table_section(
        path, "kvzip's split over the heads, on real text",
        "`kvzip` keeps the same count of tokens in every kv head of a layer; `kvzip-adaptive` (`--kv-head-alloc "
        "adaptive`) ranks a layer's tokens over all its heads at once, as the KVzip paper and kvpress do, so heads "
        "keep different counts. Passkey needles in two Austen novels (and the RULER filler for comparison), "
        "multi-key needles, perplexity; a retrieval cell is the accuracy over its samples with the 95% (Wilson) interval.")


def layer_split_section(path, title, intro):
    """A scorer's total budget split over the layers by the squeeze coordinator (--kv-layer-alloc
    squeeze) against the same count in every layer (a config of two policies, uniform first), and
    how the two compare cell by cell."""
    out = policy_table_section(path, title, intro)
    found = sweep_records(path)
    if not out or not found:
        return out
    cfg, recs = found
    labels = [p.get("label", p["kv_policy"]) for p in cfg["policies"]]
    if len(labels) != 2:
        return out
    g = {(r["task"], r["policy"], r["budget_fraction"]): r for r in recs}
    better = same = worse = 0
    for (task, pol, f), r in g.items():
        if pol != labels[1] or (task, labels[0], f) not in g:
            continue
        a, b = g[(task, labels[0], f)]["value"], r["value"]
        sign = (a - b) if r["metric"] == "ppl" else (b - a)
        better, same, worse = better + (sign > 0), same + (sign == 0), worse + (sign < 0)
    cells = lambda n: f"{n} cell" + ("" if n == 1 else "s")
    out[-1:-1] = ["", f"`{labels[1]}` against `{labels[0]}`: better in {cells(better)}, the same in {cells(same)}, "
                      f"worse in {cells(worse)}."]
    return out


def real_text_section(path):
    """Retrieval from real prose (e.g. bench/sweep_smollm2_real.json): needles and a qa fact in Austen
    novels, every policy beside the full cache, and each task's best policy at each share against
    the full cache's accuracy. First in the report: the filler haystacks below flatter the policies
    that score novelty."""
    out = policy_table_section(
        path, "Retrieval from real text (Austen novels)",
        "the needles sit in the prose of two Austen novels (`--haystack`), not in RULER's repeated filler "
        "sentences, so a needle is not the only novel thing in the context. `passkey`: a 5-digit key; `qa`: a fact "
        "told in a sentence (\"Mr. Quenby's uncle had a tortoise called Clover...\"), asked as a question whose answer "
        "is the name; `niah-multikey`: one of four keys, the others distractors. The context is compressed before "
        "the question; 10 samples a cell (depths 0.1-0.9); a cell is the accuracy with its 95% (Wilson) interval. "
        "`kvzip-adaptive` is kvzip with its heads ranked together (`--kv-head-alloc adaptive`), as KVzip and kvpress "
        "rank.")
    found = sweep_records(path)
    if not out or not found:
        return out
    cfg, recs = found
    labels = [p.get("label", p["kv_policy"]) for p in cfg["policies"]]
    g = {(r["task"], r["policy"], r["budget_fraction"]): r for r in recs}
    lines = []
    for task in dict.fromkeys(r["task"] for r in recs):
        full = g.get((task, "full", 1.0))
        if not full or full["metric"] == "ppl":
            continue
        for f in sorted({r["budget_fraction"] for r in recs if r["task"] == task and r["policy"] != "full"}):
            cand = [(g[(task, lab, f)]["value"], lab) for lab in labels if (task, lab, f) in g]
            if not cand:
                continue
            best = max(v for v, _ in cand)
            who = ", ".join(lab for v, lab in cand if v == best)
            ratio = f"{best / full['value']:.2f}x" if full["value"] > 0 else "-"
            lines.append(f"- {task} at {100 * f:g}%: best **{who}** {best:.2f} against the full cache's "
                         f"{full['value']:.2f} ({ratio}).")
    out[-1:-1] = [""] + lines
    return out


def kvzip_layers_section(path):
    """kvzip's split over the layers (e.g. bench/sweep_smollm2_kvzip_layers.json)."""
    return layer_split_section(
        path, "kvzip's split over the layers (SqueezeAttention over KVzip's scores), on real text",
        "`kvzip-adaptive` keeps the average budget in every layer (its heads ranked together, as above); "
        "`kvzip-adaptive-squeeze` (`--kv-layer-alloc squeeze`) lets the squeeze coordinator re-split the same total "
        "over the layers from each layer's report at the end of the scoring pass: the share of its reconstruction "
        "scores that its average budget's highest hold (lower: more budget; strength 0.5, inverse allocation, "
        "capped at the prompt). A retrieval cell is the accuracy over its samples with the 95% (Wilson) interval.")


def snapkv_layers_section(path):
    """snapkv's split over the layers (e.g. bench/sweep_smollm2_snapkv_layers.json)."""
    return layer_split_section(
        path, "snapkv's split over the layers (SqueezeAttention over SnapKV's scores), on real text",
        "`snapkv` keeps the average budget in every layer; `snapkv-squeeze` (`--kv-layer-alloc squeeze`) lets the "
        "squeeze coordinator re-split the same total over the layers from each layer's report at its first "
        "eviction: the share of its pooled window scores that its average budget's highest hold (strength 0.5, "
        "inverse allocation, capped at the prompt). SnapKV scores the prompt by its last 32 queries, so the "
        "question-aware rows (the question ends the prompt) are its setting. A retrieval cell is the accuracy over "
        "its samples with the 95% (Wilson) interval.")


def policy_table_section(path, title, intro):
    """One sweep's policies side by side per task and budget share (accuracy with 95% intervals,
    perplexity), beside the full cache."""
    found = sweep_records(path)
    if not found:
        return []
    cfg, recs = found
    base, ext = os.path.splitext(cfg["output"])
    labels = [p.get("label", p["kv_policy"]) for p in cfg["policies"]]
    g = {(r["task"], r["policy"], r["budget_fraction"]): r for r in recs}
    commits = sorted({r.get("git_commit", "?") for r in recs})
    ctxs = sorted({r["ctx"] for r in recs})
    out = [f"## {title}", "",
           f"Config `{path}` (records `{os.path.relpath(base)}*{ext}`, engine commit(s) {', '.join(commits)}; "
           f"{', '.join(str(c) for c in ctxs)} tokens): " + intro, "",
           "| task | share | full | " + " | ".join(labels) + " |", "|---|---|---|" + "---|" * len(labels)]
    tasks = []
    for r in recs:
        if r["task"] not in tasks:
            tasks.append(r["task"])
    for task in tasks:
        full = g.get((task, "full", 1.0))
        shares = sorted({r["budget_fraction"] for r in recs if r["task"] == task and r["policy"] != "full"})
        for f in shares:
            cells = []
            for r in [full] + [g.get((task, lab, f)) for lab in labels]:
                if r is None:
                    cells.append("–")
                elif r["metric"] == "ppl":
                    cells.append(f"{r['value']:.2f}")
                else:
                    n, k = r.get("n_samples", 0), r.get("n_correct", 0)
                    lo, hi = wilson(k, n) if n else (0.0, 0.0)
                    cells.append(f"{r['value']:.2f} ({k}/{n}, [{lo:.2f}, {hi:.2f}])")
            out.append(f"| {task} | {100 * f:g}% | " + " | ".join(cells) + " |")
    out.append("")
    return out


def kvpress_section(out_dir):
    """The side-by-side runs of bench/compare_kvpress.py (kvpress_*.json beside the records)."""
    files = sorted(glob.glob(os.path.join(out_dir, "kvpress_*.json")))
    if not files:
        return []
    out = ["## Against NVIDIA kvpress (same GGUF, same prompts)", "",
           "`bench/compare_kvpress.py`: squeezekv's policies and the matching kvpress presses on Hugging Face "
           "transformers (the same GGUF, dequantized to f32 by transformers), on exactly the same token ids "
           "(squeezekv's `eval retrieval --json` writes them), greedy answers, exact match.", "",
           "| task | policy / press | budget | squeezekv | kvpress | same outcome |", "|---|---|---|---|---|---|"]
    notes, real = [], []
    for f in files:
        doc = json.load(open(f))
        for r in doc["rows"]:
            hay = r.get("haystack", "filler")
            task = (f"passkey {r['ctx']}" + (" question-aware" if r["question_aware"] else "") +
                    ("" if hay == "filler" else f", {os.path.splitext(os.path.basename(hay))[0].capitalize()}"))
            if hay != "filler" and "KVzip" in r["press"]:
                real.append((task, r))
            n = r["samples"]
            same = round(r["same_outcome"] * n)
            out.append(f"| {task} | {r['policy']} / {r['press']} | {100 * r['fraction']:g}% | "
                       f"{r['squeezekv_accuracy']:.2f} | {r['kvpress_accuracy']:.2f} | {same}/{n} |")
            if n - same > n / 10:
                diff = [d for d in r["detail"] if d["squeezekv_correct"] != d["kvpress_correct"]]
                note = (f"- {task}, {r['policy']} / {r['press']}: {n - same} of {n} samples differ, e.g. depth {diff[0]['depth']}: "
                        f"squeezekv \"{diff[0]['squeezekv'].strip()[:60]}\", kvpress \"{diff[0]['kvpress'].strip()[:60]}\".")
                if note not in notes:
                    notes.append(note)
    out.append("")
    if notes:
        out += ["Where the two differ by more than one sample in ten:", ""] + notes + [""]
        out += ["What differs between the two KVzip implementations (read from kvpress 0.5.5's `kvzip_press.py`): "
                "kvpress scores only the tokens after the chat template's opening (the template's system prompt "
                "gets score 0, so it goes first), normalises each repeat row's softmax over the sinks, the chunk "
                "being repeated and the repeat rows only, wraps the repeat instruction in the chat template, and "
                "prunes by one bottom-k over all heads of a layer (`layerwise=True`: heads keep different "
                "counts) or of the whole model (its default) by masking the pruned keys; squeezekv scores every "
                "cached token with the real attention over the whole cache, repeats after a plain-text "
                "instruction, and keeps the same count in every head of a layer. On the filler, kvpress's misses are the "
                "shallow needles (depths 0.1-0.3 and one at 0.5), answered with the key's first digit only, the "
                "mark of digits lost in some layers or heads. Two differences are ruled out: squeezekv's kvzip "
                "with kvpress's ranking over the heads (`--kv-head-alloc adaptive`: one bottom-k over a layer's "
                "heads, no per-head floor) also answers 10 of 10 on these prompts (`squeezekv eval retrieval "
                "--task passkey --ctx 2048 --depths 0.1 0.3 0.5 0.7 0.9 --samples 2 --kv-policy kvzip --kv-budget "
                "410 --kv-head-alloc adaptive`), and so does it with the repeat instruction closed as a chat turn "
                "as kvpress does (\"...exactly.<|im_end|>\\n<|im_start|>assistant\\n\", a one-line change of "
                "`Runner::score_context` tried and reverted). Left to isolate: the softmax restricted to the "
                "repeated chunk and the template prefix scored 0. kvpress's own default (one ratio over all "
                "layers and heads) is the row marked (global).", ""]
    if real:
        cells = "; ".join(f"{t}: {r['policy']} {r['squeezekv_accuracy']:.2f}, {r['press']} {r['kvpress_accuracy']:.2f}"
                          for t, r in real)
        ranked = [r for _, r in real if r["policy"] == "kvzip-adaptive"]
        if ranked and all(r["kvpress_accuracy"] <= r["squeezekv_accuracy"] for r in ranked):
            verdict = "kvpress's own KVzip answers no more than squeezekv's kvzip with the heads ranked together"
        else:
            verdict = "kvpress's own KVzip and squeezekv's differ as the table shows"
        out += ["On real prose (" + cells + "): " + verdict + ", on the same model and token ids. The needle trace "
                "above shows where the key goes on this model: in most layers its digits rank in the bottom half of "
                "the scores.", ""]
    return out


def needle_trace_section(results_dir):
    """docs/results/needle_trace/ (its run.sh and table.py): where each policy left the pass key's
    tokens, layer by layer (eval retrieval --trace-needles)."""
    table = os.path.join(results_dir, "needle_trace", "table.md")
    if not os.path.exists(table):
        return []
    return ["## Where the pass key goes in real text", "",
            "`docs/results/needle_trace/` (`run.sh`: `eval retrieval --trace-needles`, Emma, 2048 tokens, 20% KV, "
            "10 samples): the key's digit tokens followed through every eviction until the answer. Per layer and "
            "policy, over the samples the policy missed: the share of (digit, kv head) pairs held / their median "
            "rank by the policy's score when it last decided about them (0 the top of the rows held, 1 the "
            "bottom). What it shows is in that folder's README.", ""] + open(table).read().strip().splitlines() + [""]


def window_attention_section(out_dir):
    """bench/window_attention.cc's table: where the question's attention goes, layer by layer."""
    files = sorted(glob.glob(os.path.join(out_dir, "window_attention_*.txt")))
    if not files:
        return []
    out = []
    for f in files:
        text = open(f).read().strip().splitlines()
        rows = [l.split() for l in text[2:] if l.strip() and l.split()[0].isdigit()]
        if not rows:
            continue
        needle = [float(r[2]) for r in rows]
        sinks = [float(r[1]) for r in rows]
        kept = [float(r[5]) for r in rows]
        L = len(rows)
        first = next((i for i in range(L) if sinks[i] >= 0.25), L - 1)
        deep = list(range(first, L))
        out += ["## Why snapkv and pyramidkv lose the needle even when they see the question", "",
                f"`build/squeezekv_window_attention MODEL RECORD` on the question-aware prompts ({text[0]}). The "
                "question is SnapKV's observation window: its rows' attention decides what stays. Per layer, the "
                "share of that attention on the sinks (first 4 tokens), the needle's tokens, the window itself and "
                "the rest, and the share of needle tokens snapkv keeps at 40%:", ""]
        out += ["```"] + text[1:] + ["```", ""]
        out.append(f"- The question rows give the needle {min(needle):.1%}-{max(needle):.1%} of their attention in "
                   f"every layer: SmolLM2-135M does not look up the pass key while it reads the question (the full cache "
                   f"answers, so the lookup happens in the answer's own steps). From layer {deep[0]} on, {min(sinks[i] for i in deep):.0%}-"
                   f"{max(sinks[i] for i in deep):.0%} goes to the sinks, in the first layers most goes to the "
                   "window and the haystack.")
        first_layers = sorted(kept[:4])
        out.append(f"- So the window's scores do not single the needle out: snapkv keeps {min(kept):.0%}-{max(kept):.0%} "
                   f"of the needle's tokens per layer (mean {sum(kept) / L:.0%}; {first_layers[0]:.0%}-{first_layers[-1]:.0%} "
                   "in the first four layers), and an answer needs every digit, in every layer that carries it to the "
                   "copy. kvzip's reconstruction pass makes the model read every token as it repeats the context, "
                   "which is exactly the lookup the question never triggers here.")
        out.append("")
    return out


def best_section(groups, labels, fr):
    """One table: for each task and length, the best policy at each budget (value, and x full)."""
    out = ["## The best policy per task and budget", "",
           "Each cell: the best policy at that share of the cache and its value; for perplexity (lower is better) "
           "its ratio to the full cache in brackets, for retrieval (higher is better) the full cache's accuracy is "
           "the second column; ties list every best policy.", "",
           "| task, tokens | full | " + " | ".join(f"{100 * f:g}%" for f in fr) + " |",
           "|---|---|" + "---|" * len(fr)]
    for (task, ctx) in sorted(groups):
        g = groups[(task, ctx)]
        metric = next(iter(g.values()))["metric"]
        better = min if metric == "ppl" else max
        full = g.get(("full", 1.0))
        cells = []
        for f in fr:
            cand = [(g[(lab, f)]["value"], lab) for lab in labels if (lab, f) in g]
            if not cand:
                cells.append("–")
                continue
            v = better(x for x, _ in cand)
            tied = [lab for x, lab in cand if x == v]
            who = ", ".join(tied) if len(tied) <= 3 else f"{len(tied)} policies tie"
            ratio = f" ({v / full['value']:.3f}x)" if metric == "ppl" and full else ""
            cells.append(f"**{who}** {fmt(metric, v)}{ratio}")
        out.append(f"| {task}, {ctx} | {fmt(metric, full['value']) if full else '–'} | " + " | ".join(cells) + " |")
    out.append("")
    return out


def report(a):
    import plot_sweep  # matplotlib is needed for the report only

    cfg = json.load(open(a.config))
    base, ext = os.path.splitext(cfg["output"])
    files = sorted(set(glob.glob(base + "*" + ext)))
    if not files:
        sys.exit(f"make_results: no records matching {base}*{ext}; run the sweep first")
    recs = plot_sweep.load(files)
    out_dir = os.path.dirname(cfg["output"]) or "."
    charts = plot_sweep.plot_metric(recs, out_dir) + plot_sweep.plot_accuracy(recs, out_dir)
    lb = plot_sweep.plot_layer_budgets(recs, out_dir)
    fr = sorted(cfg["budget_fractions"])
    labels = [p.get("label", p["kv_policy"]) for p in cfg["policies"]]
    groups = defaultdict(dict)
    for r in recs:
        groups[(r["task"], r["ctx"])][(r["policy"], r["budget_fraction"])] = r
    expected = sum(len(t["ctx"]) * (1 + len(labels) * len(t.get("budget_fractions", fr))) for t in cfg["tasks"])
    setup = ["## How these were measured", ""]
    setup.append(f"Model `{cfg['model']}`; config `{a.config}`; {len(recs)} of {expected} runs recorded "
                 f"(records: `{os.path.relpath(base)}*{ext}`, {len(files)} files, one JSON line per run).")
    commits = sorted({r.get("git_commit", "?") for r in recs})
    setup.append(f"Engine commit(s): {', '.join(commits)}. Machine: {a.machine}.")
    if len(commits) > 1:
        setup.append("The sweep resumed across engine commits whose kernels differ in speed and in the order of "
                     "floating-point operations, not in what they compute; every run used f32 decode arithmetic, and "
                     "a run's commit is in its record.")
    setup.append("")
    for t in cfg["tasks"]:
        if t["task"] == "ppl":
            setup.append(f"- `{t.get('label', 'ppl')}`: perplexity (`{t['text']}`, {t.get('windows', 1)} window(s) of {', '.join(map(str, t['ctx']))} "
                         f"tokens): prefill the first {100 * t.get('prefix_fraction', 0.5):g}% of the window, then "
                         "teacher-forced one-token steps with eviction active at every step; every continuation token "
                         "is scored (lower is better).")
        else:
            n = len(t.get("depths", [])) * t.get("samples", 1)
            if t.get("question_aware"):
                how = (f"the question ends the prompt, which is prefilled in one step (prefill chunk "
                       f"{t.get('prefill_chunk', 512)}), so compression sees the question (SnapKV's setting)")
            else:
                how = "the context is prefilled and compressed first, then the question (a cache reused across questions)"
            only = (f" (budgets {', '.join(f'{100 * f:g}%' for f in t['budget_fractions'])} only, for time)"
                    if "budget_fractions" in t else "")
            setup.append(f"- `{t.get('label', t['task'])}` at {', '.join(map(str, t['ctx']))} tokens{only}: RULER-style "
                         f"`{t['task']}` needles at depths {', '.join(map(str, t.get('depths', [])))} of filler text, "
                         f"{n} samples per cell (seed {t.get('seed', 1)}); {how}; greedy answer, exact match (higher "
                         f"is better). One sample is {1 / n:.2f} of a cell's accuracy; brackets give the 95% "
                         "(Wilson) interval.")
    setup.append("- Budgets are tokens per layer as a share of the context (`squeeze` keeps that average across "
                 "layers); `full` keeps everything. Regenerate with `scripts/make_results.py` (see its header).")
    setup.append("- " + describe(cfg["policies"]))
    setup.append("")
    rel = os.path.relpath(out_dir, os.path.dirname(os.path.abspath(a.out)) or ".")
    lines = ["# Quality per byte: results", "",
             "Which KV policy keeps the most quality in a given share of the cache, on the default model: perplexity "
             "on two real texts and needle retrieval, every policy at 5-40% of the full cache. First retrieval from "
             "real prose; then, from the main sweep (whose retrieval haystacks are RULER's filler sentences, a "
             "labelled second setting), the best policy per task and budget, the charts, what the numbers say and "
             "the full tables; how they were measured and the issues' target lines at the end.", ""]
    lines += real_text_section(a.real_config)
    lines += best_section(groups, labels, fr)
    lines.append("## Charts")
    lines.append("")
    for c in charts:
        lines.append(f"![{c}]({rel}/{c})")
    if lb:
        lines.append("")
        lines.append(f"![per-layer budgets]({rel}/{lb})")
    lines.append("")
    lines += findings(recs, cfg, labels, fr)
    wins = defaultdict(int)
    verdicts = []
    for (task, ctx) in sorted(groups):
        g = groups[(task, ctx)]
        metric = next(iter(g.values()))["metric"]
        better = min if metric == "ppl" else max
        lines.append(f"## {task}, {ctx} tokens ({'perplexity' if metric == 'ppl' else 'accuracy'})")
        lines.append("")
        full = g.get(("full", 1.0))
        lines.append("| policy | " + " | ".join(f"{100 * f:g}%" for f in fr) + " |")
        lines.append("|---|" + "---|" * len(fr))
        if full:
            lines.append(f"| full (kept bytes {full['kept_bytes'] / 1e6:.1f} MB) | " +
                         " | ".join(cell(full) for _ in fr) + " |")
        for lab in labels:
            row = [cell(g[(lab, f)]) if (lab, f) in g else "–" for f in fr]
            lines.append(f"| {lab} | " + " | ".join(row) + " |")
        lines.append("")
        for f in fr:
            cand = [(g[(lab, f)]["value"], lab) for lab in labels if (lab, f) in g]
            if len(cand) < 2:
                continue
            best_v = better(v for v, _ in cand)
            best = [lab for v, lab in cand if v == best_v]
            rest = [v for v, lab in cand if v != best_v]
            if len(best) == len(cand):
                verdicts.append(f"- {task} {ctx} at {100 * f:g}%: all policies tie at {fmt(metric, best_v)}.")
                continue
            for lab in best:
                wins[lab] += 1
            runner = better(rest)
            if metric == "ppl":
                margin = f"{100 * (runner - best_v) / runner:.1f}% lower perplexity than the next ({fmt(metric, runner)})"
            else:
                margin = f"{best_v - runner:+.2f} accuracy over the next ({fmt(metric, runner)})"
            h2o = g.get(("h2o", f))
            vs = ""
            if h2o and "h2o" not in best:
                vs = f"; h2o {fmt(metric, h2o['value'])}"
            verdicts.append(f"- {task} {ctx} at {100 * f:g}%: **{', '.join(best)}** {fmt(metric, best_v)}, {margin}{vs}.")
    lines += windows_section(a.windows_config)
    lines += kv_types_section(a.kv_types_config, os.path.dirname(os.path.abspath(a.out)))
    lines += kv_types_retrieval_section(a.kv_types_retrieval_config)
    lines += kvzip_heads_section(a.kvzip_heads_config)
    lines += kvzip_layers_section(a.kvzip_layers_config)
    lines += snapkv_layers_section(a.snapkv_layers_config)
    lines += needle_trace_section(os.path.join(os.path.dirname(os.path.abspath(a.out)), "results"))
    lines += kvpress_section(out_dir)
    lines += window_attention_section(out_dir)
    lines.append("## Who wins where")
    lines.append("")
    if wins:
        lines.append("Wins (best or tied-best, ties where every policy scores the same excluded): " +
                     ", ".join(f"{k} {v}" for k, v in sorted(wins.items(), key=lambda kv: -kv[1])) + ".")
        lines.append("")
    lines += verdicts
    lines.append("")
    lines += setup
    lines += targets(recs)
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("wrote", a.out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shard")
    s.add_argument("--config", required=True)
    s.add_argument("--shards", type=int, default=8)
    s.add_argument("--dir", required=True)
    s.add_argument("--name", default="shard", help="shard records go to <output base>.<name><i>-<j>.jsonl")
    r = sub.add_parser("report")
    r.add_argument("--config", required=True)
    r.add_argument("--machine", default="not stated")
    r.add_argument("--out", default="docs/RESULTS.md")
    r.add_argument("--windows-config", default="bench/sweep_smollm2_ppl_windows.json",
                   help="a second sweep of the perplexity cells over several windows (skipped when it has no records)")
    r.add_argument("--kv-types-config", default="bench/sweep_smollm2_kv_types.json",
                   help="a sweep with a kv_types axis: quality against kept bytes (skipped when it has no records)")
    r.add_argument("--kv-types-retrieval-config", default="bench/sweep_smollm2_kv_types_passkey.json",
                   help="retrieval tasks with a kv_types axis: accuracy under each row type (skipped when it has no records)")
    r.add_argument("--kvzip-heads-config", default="bench/sweep_smollm2_kvzip_heads.json",
                   help="kvzip's two splits over the heads on real text (skipped when it has no records)")
    r.add_argument("--real-config", default="bench/sweep_smollm2_real.json",
                   help="retrieval from real prose, every policy (first in the report; skipped when it has no records)")
    r.add_argument("--kvzip-layers-config", default="bench/sweep_smollm2_kvzip_layers.json",
                   help="kvzip's total split over the layers by the squeeze coordinator (skipped when it has no records)")
    r.add_argument("--snapkv-layers-config", default="bench/sweep_smollm2_snapkv_layers.json",
                   help="snapkv's total split over the layers by the squeeze coordinator (skipped when it has no records)")
    a = ap.parse_args()
    shard(a) if a.cmd == "shard" else report(a)


if __name__ == "__main__":
    main()
