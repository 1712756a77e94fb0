#!/usr/bin/env python3
"""The paper's experiment (docs/MATH.md §9) on PyTorch: continuum vs softmax vs focal
attention in one byte-level decoder, all through continuum_attention.attention.

    python experiments/tinystories/main.py train   --preset cpu --attention continuum --seed 0 --out runs/x
    python experiments/tinystories/main.py sweep   --preset cpu --kernels continuum,softmax,focal --seeds 0,1,2,3,4 --out runs/cpu
    python experiments/tinystories/main.py compare runs/cpu
    python experiments/tinystories/main.py plot    runs/cpu --out curves.png
    python experiments/tinystories/main.py plot-attention --checkpoint A --checkpoint B --out att.png
    python experiments/tinystories/main.py eval    --checkpoint runs/x/model.safetensors
    python experiments/tinystories/main.py generate --checkpoint runs/x/model.safetensors --prompt "Once"
    python -m torch.distributed.run --standalone --nproc-per-node 2 experiments/tinystories/main.py train ...   (DDP)

See experiments/tinystories/README.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "data", "tinystories"))
DEFAULT_TRAIN = f"{DATA}/train.txt+{DATA}/train-extra.txt"
DEFAULT_SELECT = f"{DATA}/valid.txt:0:0.2"
DEFAULT_TESTS = [f"{DATA}/valid.txt:0.2:0.6", f"{DATA}/valid.txt:0.6:1"]


def add_config_options(p: argparse.ArgumentParser) -> None:
    from config import Config, PRESETS
    p.add_argument("--preset", choices=PRESETS, default="cpu", help="preset the other fields start from")
    for f in dataclasses.fields(Config):
        if f.name == "preset":
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None)
        else:
            typ = {"int": int, "float": float, "str": str}.get(f.type, f.type)
            p.add_argument(flag, dest=f.name, type=typ, default=None)


def config_from(args, **override):
    from config import preset
    c = preset(args.preset)
    from config import Config
    for f in dataclasses.fields(Config):
        v = getattr(args, f.name, None)
        if f.name != "preset" and v is not None:
            setattr(c, f.name, v)
    for k, v in override.items():
        setattr(c, k, v)
    return c.validate()


def add_data_options(p):
    p.add_argument("--train", default=DEFAULT_TRAIN,
                   help="training text: PATH[:FROM:TO], '+'-joined (default: both TinyStories train files)")
    p.add_argument("--select", default=DEFAULT_SELECT,
                   help="selection slice: validation curves; every choice made by looking at numbers uses it")
    p.add_argument("--test", action="append", default=None,
                   help="test slice (repeatable), disjoint from --select; reported numbers come from these")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))


def cmd_train(args):
    from data import load_slice
    from train import train
    cfg = config_from(args)
    tests = [load_slice(s) for s in (args.test or DEFAULT_TESTS)]
    r = train(cfg, load_slice(args.train), load_slice(args.select), tests, args.out,
              device=args.device, progress=not args.no_progress)
    if r:
        ev = ", ".join(f"{k} {v['nats_per_byte']:.4f}" for k, v in r["eval"].items())
        tps = r["time"]["tokens_per_second"]  # None: no training step (--steps 0)
        speed = f"{tps:,.0f} tokens/s" if tps is not None else "no training steps"
        print(f"{cfg.attention} seed {cfg.seed}: {ev} nats/byte; {speed}; {args.out}/result.json")


def run_name(kernel, context, tau, seed, learned):
    return f"{kernel}_ctx{context}_tau{tau:g}{'_learned' if learned else ''}_seed{seed}"


def cmd_sweep(args):
    from analysis import write_compare
    base = config_from(args)
    grid = []
    for ctx in (args.contexts or [base.context]):
        for seed in args.seeds:
            for k in args.kernels:
                name = run_name(k, ctx, base.temperature, seed, base.learn_temperature)
                grid.append((name, k, ctx, seed))
    todo = [g for g in grid if not os.path.exists(os.path.join(args.out, g[0], "result.json"))]
    print(f"sweep: {len(grid)} runs, {len(grid) - len(todo)} already finished, {len(todo)} to go "
          f"({args.jobs} at a time, {base.threads} threads each)", flush=True)
    passthrough = [a for a in sys.argv[2:]]

    def one(g):
        name, k, ctx, seed = g
        cmd = [sys.executable, os.path.join(HERE, "main.py"), "train", *strip(passthrough),
               "--attention", k, "--context", str(ctx), "--seed", str(seed),
               "--out", os.path.join(args.out, name)]
        if args.jobs > 1:
            cmd.append("--no-progress")
        t = time.time()
        rc = subprocess.call(cmd)
        print(f"sweep: {name} {'done' if rc == 0 else f'FAILED (status {rc})'} in {time.time() - t:.0f} s",
              flush=True)
        return rc

    with ThreadPoolExecutor(max_workers=args.jobs) as ex:
        rcs = list(ex.map(one, todo))
    if any(rcs):
        sys.exit(f"sweep: {sum(1 for r in rcs if r)} runs failed")
    print(write_compare([args.out], os.path.join(args.out, "compare")))


def strip(argv):
    """The sweep's own options removed from argv, leaving the config/data ones."""
    own = {"--kernels", "--seeds", "--contexts", "--jobs", "--out"}
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        key = a.split("=", 1)[0]
        if key in own:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def cmd_compare(args):
    from analysis import write_compare
    print(write_compare(args.runs, args.out or os.path.join(args.runs[0], "compare")), end="")


def cmd_plot(args):
    from analysis import plot_curves
    plot_curves(args.runs, args.out)
    print(args.out)


def cmd_plot_attention(args):
    from analysis import plot_attention
    from train import load_checkpoint
    models = {}
    for path in args.checkpoint:
        m = load_checkpoint(path).eval()
        models[f"{m.cfg.attention} ({os.path.basename(os.path.dirname(os.path.abspath(path)))})"] = m
    plot_attention(models, args.text, args.layer, args.head, args.out)
    print(args.out)


def cmd_eval(args):
    import torch
    from data import load_slice
    from train import evaluate, load_checkpoint, write_json
    torch.set_num_threads(args.threads)
    m = load_checkpoint(args.checkpoint).eval()
    res = {}
    for spec in (args.valid or [DEFAULT_SELECT, *DEFAULT_TESTS]):
        s = load_slice(spec)
        res[s.label] = evaluate(m, s.data, spec=spec)
        print(f"{s.label}: {res[s.label]['nats_per_byte']:.6f} nats/byte over {res[s.label]['bytes']} bytes")
    if args.json:
        write_json(args.json, res)


def cmd_generate(args):
    import torch
    from train import load_checkpoint
    m = load_checkpoint(args.checkpoint).eval()
    g = torch.Generator().manual_seed(args.seed)
    ids = list(args.prompt.encode()) or [10]
    with torch.no_grad():
        for _ in range(args.bytes):
            logits = m(torch.tensor([ids[-m.cfg.context:]]))[0, -1].double()
            if args.sample_temperature <= 0:
                nxt = int(logits.argmax())
            else:
                probs = torch.softmax(logits / args.sample_temperature, -1)
                nxt = int(torch.multinomial(probs, 1, generator=g))
            ids.append(nxt)
    sys.stdout.write(bytes(ids).decode("utf-8", errors="replace") + "\n")


def sample_temperature(s: str) -> float:
    """--sample-temperature: finite and >= 0 (0 = greedy), as in continuum-lm."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {s!r}") from None
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"must be finite and >= 0 (0 = greedy), got {s!r}")
    return v


def main(argv=None):
    sys.path.insert(0, HERE)
    # allow_abbrev=False everywhere: an abbreviation (--kernel for --kernels)
    # would be accepted here but not by the runs sweep starts (strip).
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train", allow_abbrev=False,
                       help="train one run; writes model.safetensors and result.json in --out")
    add_config_options(p)
    add_data_options(p)
    p.add_argument("--out", required=True)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("sweep", allow_abbrev=False,
                       help="kernels x seeds x contexts, resumable (finished runs are skipped)")
    add_config_options(p)
    add_data_options(p)
    p.add_argument("--kernels", type=lambda s: s.split(","), default=["continuum", "softmax", "focal"])
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2, 3, 4])
    p.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=None)
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (each with --threads threads)")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_sweep)

    p = sub.add_parser("compare", allow_abbrev=False,
                       help="the table: mean ± sd, paired differences, 95%% CI, seeds won")
    p.add_argument("runs", nargs="+", help="folders searched for result.json")
    p.add_argument("--out", help="output prefix for .txt/.json/.csv (default RUNS/compare)")
    p.set_defaults(fn=cmd_compare)

    p = sub.add_parser("plot", allow_abbrev=False, help="validation curves (selection slice) per kernel, PNG")
    p.add_argument("runs", nargs="+")
    p.add_argument("--out", default="curves.png")
    p.set_defaults(fn=cmd_plot)

    p = sub.add_parser("plot-attention", allow_abbrev=False,
                       help="attention weights P of one layer/head per checkpoint, PNG")
    p.add_argument("--checkpoint", action="append", required=True)
    p.add_argument("--text", default="Once upon a time, there was a little girl named Lily. She loved to play outside.")
    p.add_argument("--layer", type=int, default=1)
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--out", default="attention.png")
    p.set_defaults(fn=cmd_plot_attention)

    p = sub.add_parser("eval", allow_abbrev=False, help="nats/byte of a checkpoint on text slices")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--valid", action="append", help="PATH[:FROM:TO] (repeatable)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    p.set_defaults(fn=cmd_eval)

    p = sub.add_parser("generate", allow_abbrev=False, help="sample bytes from a checkpoint")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--bytes", type=int, default=200)
    p.add_argument("--sample-temperature", type=sample_temperature, default=0.8,
                   help="sampling temperature, finite and >= 0 (0 = greedy)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_generate)

    args = ap.parse_args(argv)
    try:
        args.fn(args)
    except (ValueError, OSError) as e:
        sys.exit(f"{os.path.basename(sys.argv[0])} {args.cmd}: error: {e}")


if __name__ == "__main__":
    main()
