"""compare (the paper-style table with paired statistics) and plots.

compare: runs are grouped by setting (context, tau, learned or fixed); for each
evaluation slice, per kernel mean +- sd over seeds, then the paired differences
continuum - softmax and continuum - focal over the seeds both finished: mean,
95 % confidence interval from Student's t (scipy.stats.t), seeds won (negative
difference = continuum better), and each seed's difference.

Where a kernel was run at more than one temperature in otherwise the same setting
(fixed τ values, or τ learned from an initial value), compare also selects each
kernel's temperature on the selection slice (the lowest mean NLL there) and gives the
paired differences on the test slices between the kernels at their selected
temperatures: the paper's "strongest selected softmax baseline" (docs/MATH.md §9).
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


def group_of(cfg: dict) -> str:
    """setting_of without the temperature: the runs among which a temperature is selected."""
    return (f"{cfg['preset']}: {cfg['n_layer']}L d{cfg['d_model']} h{cfg['n_head']} "
            f"ctx {cfg['context']}, {cfg['steps']} steps x {cfg['batch_size']}")


def tau_of(cfg: dict) -> str:
    """A run's temperature: "0.3" (fixed), or "0.3 learned" (learned from 0.3)."""
    return f"{cfg['temperature']:g}" + (" learned" if cfg.get("learn_temperature") else "")


# What the runs of one setting may differ in: the kernel and the seed (and the thread
# count, which moves only roundings). Everything else in a result — the rest of the
# config, the texts trained and evaluated on, the machine — makes another setting.
VARIES = ("attention", "seed", "threads")


def setting_key(r: dict, also: tuple = ()) -> dict:
    key = {k: v for k, v in r["config"].items() if k not in VARIES + also}
    key.update(train=r["train"].get("text"), select=r["select"], tests=r["tests"],
               machine=r.get("machine", {}).get("cpu"))
    return key


def grouped(runs: List[dict], label, also: tuple = ()) -> Dict[str, List[dict]]:
    """runs by setting (setting_key, less the fields `also`), named label(config); two
    settings of one name get the fields they differ in appended. Two runs of one kernel,
    temperature and seed in a setting are an error (one would hide the other)."""
    by = {}
    for r in runs:
        k = json.dumps(setting_key(r, also), sort_keys=True)
        by.setdefault(k, []).append(r)
    names = defaultdict(list)
    for k, rs in by.items():
        names[label(rs[0]["config"])].append(k)
    out = {}
    for name, keys in sorted(names.items()):
        dicts = [json.loads(k) for k in keys]
        for k, d in zip(keys, dicts):
            differ = [f"{f} {d.get(f)}" for f in sorted({f for e in dicts for f in e})
                      if len({json.dumps(e.get(f)) for e in dicts}) > 1]
            rs, seen = by[k], {}
            for r in rs:
                who = (r["kernel"], tau_of(r["config"]), r["seed"])
                if who in seen:
                    raise ValueError(f"compare: two runs of {who[0]}, tau {who[1]}, seed {who[2]} in one "
                                     f"setting: {seen[who]} and {r['_path']}; compare them separately")
                seen[who] = r["_path"]
            out[name + (f" [{', '.join(differ)}]" if differ else "")] = rs
    return out


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


def slice_stats(runs: List[dict], sl: str) -> dict:
    """One evaluation slice of runs (one per kernel and seed): per kernel mean ± sd over
    its seeds, and the paired differences continuum − softmax and continuum − focal."""
    per = {k: {r["seed"]: r["eval"][sl]["nats_per_byte"] for r in runs
               if r["kernel"] == k and sl in r["eval"]} for k in KERNEL_ORDER}
    kern = {k: {"n": len(v), "mean": float(np.mean(list(v.values()))),
                "sd": float(np.std(list(v.values()), ddof=1)) if len(v) > 1 else None,
                "per_seed": {str(s): x for s, x in sorted(v.items())}}
            for k, v in per.items() if v}
    diffs = {f"continuum - {o}": paired(per["continuum"], per[o])
             for o in ("softmax", "focal") if per["continuum"] and per[o]}
    return {"kernels": kern, "paired": diffs}


def compare(runs: List[dict]) -> dict:
    """The runs (load_results) by setting: per slice, slice_stats; training speed and time."""
    table = {}
    for setting, rs in grouped(runs, setting_of).items():
        slices = sorted({s for r in rs for s in r["eval"]}, key=lambda s: (s != rs[0]["select"], s))
        entry = {"select": rs[0]["select"], "slices": {sl: slice_stats(rs, sl) for sl in slices}}
        tps = defaultdict(list)
        for r in rs:
            if r["time"].get("tokens_per_second"):
                tps[r["kernel"]].append(r["time"]["tokens_per_second"])
        entry["tokens_per_second"] = {k: float(np.median(v)) for k, v in tps.items()}
        entry["train_seconds_total"] = float(sum(r["time"]["train_seconds"] for r in rs))
        learned = defaultdict(list)  # kernel -> per seed, τ per layer (learn_temperature)
        for r in rs:
            if r["config"].get("learn_temperature") and all("tau" in t for t in r.get("temperatures", [{}])):
                learned[r["kernel"]].append([t["tau"] for t in r["temperatures"]])
        if learned:
            entry["learned_tau_per_layer"] = {k: [float(x) for x in np.mean(v, axis=0)]
                                              for k in KERNEL_ORDER if (v := learned.get(k))}
        table[setting] = entry
    return table


SELECTED = "selected temperatures: "  # key prefix of select_temperatures' entries in compare.json


def select_temperatures(runs: List[dict]) -> dict:
    """Each kernel at its selected temperature (docs/MATH.md §9, "the strongest selected
    softmax baseline"), per group of runs (load_results) that differ in nothing but the
    temperature and where some kernel ran at two or more; a temperature is a fixed τ or
    τ learned from an initial value (tau_of: "0.3", "0.3 learned"). A kernel's selected
    temperature has the lowest mean NLL on the selection slice over the seeds that all
    its temperatures finished;
    then, on every test slice, the kernels at their selected temperatures, over those
    seeds, as in compare (mean ± sd, paired differences). The selection slice's own
    differences are left out: the choice was made on it, so they would favour the
    selected kernels.
    Returns {SELECTED + group: {"select", "candidates": {kernel: {tau: {"n", "mean"}}},
    "chosen": {kernel: tau}, "slices": {test slice: slice_stats}}}."""
    out = {}
    for group, rs in grouped(runs, group_of, also=("temperature", "learn_temperature")).items():
        sel = rs[0]["select"]
        taus = defaultdict(lambda: defaultdict(dict))  # kernel -> tau_of -> seed -> run
        for r in rs:
            taus[r["kernel"]][tau_of(r["config"])][r["seed"]] = r
        if all(len(t) < 2 for t in taus.values()):
            continue
        entry = {"select": sel, "candidates": {}, "chosen": {}, "slices": {}}
        chosen_runs = []
        for k in (k for k in KERNEL_ORDER if k in taus):
            seeds = sorted(set.intersection(*(set(by_seed) for by_seed in taus[k].values())))
            if not seeds:
                raise ValueError(f"compare: {group}: no seed that every temperature of {k} finished")
            order = sorted(taus[k], key=lambda t: (t.endswith("learned"), float(t.split()[0])))
            means = {t: float(np.mean([taus[k][t][s]["eval"][sel]["nats_per_byte"] for s in seeds]))
                     for t in order}
            best = min(means, key=means.get)
            entry["candidates"][k] = {t: {"n": len(seeds), "mean": m} for t, m in means.items()}
            entry["chosen"][k] = best
            chosen_runs += [taus[k][best][s] for s in seeds]
        tests = sorted({s for r in chosen_runs for s in r["eval"]} - {sel})
        entry["slices"] = {sl: slice_stats(chosen_runs, sl) for sl in tests}
        out[SELECTED + group] = entry
    return out


def format_slice(o: io.StringIO, sl: str, role: str, s: dict, tau: Dict[str, str] = None) -> None:
    o.write(f"\n{sl}   [{role}]   mean NLL, nats/byte\n")
    o.write("  kernel      seeds   mean ± sd\n")
    for k, v in s["kernels"].items():
        sd = f"{v['sd']:.4f}" if v["sd"] is not None else "  -   "
        at = f"   (tau {tau[k]})" if tau else ""
        o.write(f"  {k:<10} {v['n']:>5}   {v['mean']:.4f} ± {sd}{at}\n")
    if s["paired"]:
        o.write("  paired difference       mean     95% CI (t)            seeds won  per seed\n")
    for name, p in s["paired"].items():
        ci = (f"[{p['ci95'][0]:+.4f}, {p['ci95'][1]:+.4f}]" if "ci95" in p else " " * 18)
        ps = " ".join(f"s{k}:{v:+.4f}" for k, v in p["per_seed"].items())
        o.write(f"  {name:<20} {p['mean']:+.4f}   {ci}   {p['won']}/{p['n']}        {ps}\n")


def format_table(table: dict) -> str:
    o = io.StringIO()
    for setting, e in table.items():
        if setting.startswith(SELECTED):
            continue
        o.write(f"## {setting}\n")
        for sl, s in e["slices"].items():
            format_slice(o, sl, "selection slice (curves)" if sl == e["select"] else "test slice", s)
        tps = ", ".join(f"{k} {v:,.0f}" for k, v in e["tokens_per_second"].items())
        o.write(f"\ntraining tokens/s (median per run): {tps}; "
                f"total training time {e['train_seconds_total'] / 60:.1f} min\n")
        for k, taus in e.get("learned_tau_per_layer", {}).items():
            o.write(f"learned tau per layer, mean over seeds: {k} {' '.join(f'{t:.3f}' for t in taus)}\n")
        o.write("\n")
    for group, e in table.items():
        if not group.startswith(SELECTED):
            continue
        o.write(f"## {group}\n\nmean NLL on {e['select']} (the selection slice) per temperature; "
                f"* = selected (the lowest)\n")
        o.write("  kernel      tau           seeds   mean\n")
        for k, c in e["candidates"].items():
            for t, v in c.items():
                mark = " *" if t == e["chosen"][k] else ""
                o.write(f"  {k:<10}  {t:<12} {v['n']:>5}   {v['mean']:.4f}{mark}\n")
        for sl, s in e["slices"].items():
            format_slice(o, sl, "test slice, each kernel at its selected tau", s, e["chosen"])
        o.write("\n")
    return o.getvalue()


def write_compare(dirs: List[str], out_prefix: str) -> str:
    runs = load_results(dirs)
    table = {**compare(runs), **select_temperatures(runs)}
    text = format_table(table)
    write_json(out_prefix + ".json", table)
    write_atomic(out_prefix + ".txt", text.encode())
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["setting", "slice", "kernel", "seeds", "mean", "sd"])
    for setting, e in table.items():
        for sl, s in e["slices"].items():
            for k, v in s["kernels"].items():
                name = f"{k} (tau {e['chosen'][k]})" if "chosen" in e else k
                w.writerow([setting, sl, name, v["n"], f"{v['mean']:.6f}",
                            "" if v["sd"] is None else f"{v['sd']:.6f}"])
    write_atomic(out_prefix + ".csv", buf.getvalue().encode())
    return text


def curve_groups(runs: List[dict]) -> Dict[str, List[dict]]:
    """The runs with a curve, by kernel, and within a kernel by temperature and whether it
    was learned where its runs differ in them (one line each in plot_curves)."""
    out = defaultdict(list)
    for k in KERNEL_ORDER:
        rs = [r for r in runs if r["kernel"] == k and r["curve"]]
        kinds = {(r["config"]["temperature"], bool(r["config"].get("learn_temperature"))) for r in rs}
        for tau, learned in sorted(kinds):
            label = k if len(kinds) == 1 else f"{k}, tau {tau:g}{' learned' if learned else ''}"
            out[label] = [r for r in rs if (r["config"]["temperature"],
                                            bool(r["config"].get("learn_temperature"))) == (tau, learned)]
    return dict(out)


LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = (None, "o", "s", "^", "v", "D")


def line_styles(groups: Dict[str, List[dict]]) -> Dict[str, tuple]:
    """(matplotlib colour, line style, marker) per curve_groups line: one colour per kernel
    (the same in every figure); a kernel's lines, in curve_groups' order (τ ascending,
    fixed before learned), solid, dashed, dotted, dash-dotted, then the same with
    markers, so that no two lines look alike."""
    out, used = {}, defaultdict(int)
    for label, rs in groups.items():
        kernel, i = rs[0]["kernel"], used[rs[0]["kernel"]]
        if i >= len(LINE_STYLES) * len(MARKERS):
            raise ValueError(f"plot: more than {len(LINE_STYLES) * len(MARKERS)} lines of {kernel}")
        out[label] = (f"C{KERNEL_ORDER.index(kernel)}", LINE_STYLES[i % len(LINE_STYLES)],
                      MARKERS[i // len(LINE_STYLES)])
        used[kernel] += 1
    return out


def plot_curves(dirs: List[str], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = load_results(dirs)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = curve_groups(runs)
    styles = line_styles(groups)
    for k, rs in groups.items():
        color, style, marker = styles[k]
        n = min(len(r["curve"]) for r in rs)
        x = np.array([p["train_bytes"] for p in rs[0]["curve"][:n]]) / 1e6
        y = np.array([[p["select_nats_per_byte"] for p in r["curve"][:n]] for r in rs])
        ax.plot(x, y.mean(0), color=color, linestyle=style, marker=marker, markersize=3,
                label=f"{k} (mean of {len(rs)} seeds)")
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
