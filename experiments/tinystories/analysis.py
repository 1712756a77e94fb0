"""compare (the paper-style table with paired statistics) and plots.

compare: runs are grouped by setting (context, tau, learned or fixed); for each
evaluation slice, per kernel mean +- sd over seeds, then the paired differences
continuum - softmax and continuum - focal over the seeds both finished: mean,
95 % confidence interval from Student's t (scipy.stats.t), seeds won (negative
difference = continuum better), and each seed's difference.
"""
from __future__ import annotations

import csv
import glob
import io
import json
import os
from collections import defaultdict
from typing import Dict, List

import numpy as np
from scipy import stats

from train import write_atomic, write_json

KERNEL_ORDER = ("continuum", "softmax", "focal")


def load_results(dirs: List[str]) -> List[dict]:
    out = []
    for d in dirs:
        paths = [d] if d.endswith(".json") else glob.glob(os.path.join(d, "**", "result.json"),
                                                           recursive=True)
        for p in sorted(paths):
            with open(p) as f:
                r = json.load(f)
            r["_path"] = p
            out.append(r)
    if not out:
        raise ValueError(f"compare: no result.json under {dirs}")
    return out


def setting_of(cfg: dict) -> str:
    learned = "learned" if cfg.get("learn_temperature") else "fixed"
    return (f"{cfg['preset']}: {cfg['n_layer']}L d{cfg['d_model']} h{cfg['n_head']} "
            f"ctx {cfg['context']}, tau {cfg['temperature']:g} ({learned}), "
            f"{cfg['steps']} steps x {cfg['batch_size']}")


def paired(a: Dict[int, float], b: Dict[int, float]) -> dict:
    seeds = sorted(set(a) & set(b))
    d = np.array([a[s] - b[s] for s in seeds])
    res = {"seeds": seeds, "per_seed": {str(s): float(x) for s, x in zip(seeds, d)},
           "mean": float(d.mean()) if len(d) else None, "won": int((d < 0).sum()), "n": len(d)}
    if len(d) >= 2:
        sem = d.std(ddof=1) / np.sqrt(len(d))
        h = float(stats.t.ppf(0.975, len(d) - 1) * sem)
        res["ci95"] = [res["mean"] - h, res["mean"] + h]
        res["t_test_p"] = float(stats.ttest_1samp(d, 0.0).pvalue)
    return res


def compare(dirs: List[str]) -> dict:
    by = defaultdict(list)
    for r in load_results(dirs):
        by[setting_of(r["config"])].append(r)
    table = {}
    for setting, runs in sorted(by.items()):
        slices = sorted({s for r in runs for s in r["eval"]}, key=lambda s: (s != runs[0]["select"], s))
        entry = {"select": runs[0]["select"], "slices": {}}
        for sl in slices:
            per = {k: {r["seed"]: r["eval"][sl]["nats_per_byte"] for r in runs
                       if r["kernel"] == k and sl in r["eval"]} for k in KERNEL_ORDER}
            kern = {k: {"n": len(v), "mean": float(np.mean(list(v.values()))),
                        "sd": float(np.std(list(v.values()), ddof=1)) if len(v) > 1 else None,
                        "per_seed": {str(s): x for s, x in sorted(v.items())}}
                    for k, v in per.items() if v}
            diffs = {f"continuum - {o}": paired(per["continuum"], per[o])
                     for o in ("softmax", "focal") if per["continuum"] and per[o]}
            entry["slices"][sl] = {"kernels": kern, "paired": diffs}
        tps = defaultdict(list)
        for r in runs:
            if r["time"].get("tokens_per_second"):
                tps[r["kernel"]].append(r["time"]["tokens_per_second"])
        entry["tokens_per_second"] = {k: float(np.median(v)) for k, v in tps.items()}
        entry["train_seconds_total"] = float(sum(r["time"]["train_seconds"] for r in runs))
        table[setting] = entry
    return table


def format_table(table: dict) -> str:
    o = io.StringIO()
    for setting, e in table.items():
        o.write(f"## {setting}\n")
        for sl, s in e["slices"].items():
            role = "selection slice (curves)" if sl == e["select"] else "test slice"
            o.write(f"\n{sl}   [{role}]   mean NLL, nats/byte\n")
            o.write("  kernel      seeds   mean ± sd\n")
            for k, v in s["kernels"].items():
                sd = f"{v['sd']:.4f}" if v["sd"] is not None else "  -   "
                o.write(f"  {k:<10} {v['n']:>5}   {v['mean']:.4f} ± {sd}\n")
            if s["paired"]:
                o.write("  paired difference       mean     95% CI (t)            seeds won  per seed\n")
            for name, p in s["paired"].items():
                ci = (f"[{p['ci95'][0]:+.4f}, {p['ci95'][1]:+.4f}]" if "ci95" in p else " " * 18)
                ps = " ".join(f"s{k}:{v:+.4f}" for k, v in p["per_seed"].items())
                o.write(f"  {name:<20} {p['mean']:+.4f}   {ci}   {p['won']}/{p['n']}        {ps}\n")
        tps = ", ".join(f"{k} {v:,.0f}" for k, v in e["tokens_per_second"].items())
        o.write(f"\ntraining tokens/s (median per run): {tps}; "
                f"total training time {e['train_seconds_total'] / 60:.1f} min\n\n")
    return o.getvalue()


def write_compare(dirs: List[str], out_prefix: str) -> str:
    table = compare(dirs)
    text = format_table(table)
    write_json(out_prefix + ".json", table)
    write_atomic(out_prefix + ".txt", text.encode())
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["setting", "slice", "kernel", "seeds", "mean", "sd"])
    for setting, e in table.items():
        for sl, s in e["slices"].items():
            for k, v in s["kernels"].items():
                w.writerow([setting, sl, k, v["n"], f"{v['mean']:.6f}",
                            "" if v["sd"] is None else f"{v['sd']:.6f}"])
    write_atomic(out_prefix + ".csv", buf.getvalue().encode())
    return text


def plot_curves(dirs: List[str], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = load_results(dirs)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, color in zip(KERNEL_ORDER, ("C0", "C1", "C2")):
        rs = [r for r in runs if r["kernel"] == k and r["curve"]]
        if not rs:
            continue
        n = min(len(r["curve"]) for r in rs)
        x = np.array([p["train_bytes"] for p in rs[0]["curve"][:n]]) / 1e6
        y = np.array([[p["select_nats_per_byte"] for p in r["curve"][:n]] for r in rs])
        ax.plot(x, y.mean(0), color=color, label=f"{k} (mean of {len(rs)} seeds)")
        if len(rs) > 1:
            ax.fill_between(x, y.min(0), y.max(0), color=color, alpha=0.15)
    sel = runs[0]["select"]
    ax.set_xlabel("training bytes (millions)")
    ax.set_ylabel(f"NLL on {sel} (first {runs[0]['config']['eval_bytes']:,} bytes), nats/byte")
    ax.set_ylim(top=min(3.0, ax.get_ylim()[1]))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _save_fig(fig, out)


def plot_attention(models: Dict[str, object], text: str, layer: int, head: int, out: str) -> None:
    """P (the weights that multiply the values) of one layer/head per model, read
    off the operator with identity values."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch
    ids = torch.tensor([list(text.encode())], dtype=torch.long)
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 5.5))
    axes = np.atleast_1d(axes)
    for ax, (name, m) in zip(axes, models.items()):
        with torch.no_grad():
            x = m.wte[ids] + m.wpe[:ids.shape[1]]
            for blk in m.h[:layer]:
                x = blk(x)
            P = m.h[layer].attn(m.h[layer].ln_1(x), return_weights=True)[0, head]
        ax.imshow(P.numpy(), cmap="viridis", vmin=0, vmax=float(P.max()))
        ax.set_title(f"{name}: P, layer {layer}, head {head}")
        ax.set_xlabel("key byte")
        ax.set_ylabel("query byte")
    fig.tight_layout()
    _save_fig(fig, out)


def _save_fig(fig, out):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_atomic(out, buf.getvalue())
