#!/usr/bin/env python3
"""PyTorch-level benchmark: continuum_attention.attention vs
torch.nn.functional.scaled_dot_product_attention on the CPU.

Runs, in one process, at batch 1, 8 heads, seq 2048, head_dim 64 (--heads,
--seq, --dim): forward and forward + backward, full and causal, our
continuum and softmax kernels and SDPA, each in float32 and bfloat16 (the
default compute: float32 arithmetic; with --exact also compute="float64" on
float32 tensors, the same kernels in double), and prints each time with the
ratio SDPA / ours in the same dtype (> 1: ours is faster). Then the per-call
overhead at batch 1, 1 head, seq 64, head_dim 32: the time of one small
forward (and forward + backward) call of each, in float32, and the dispatch
floor at seq 1, head_dim 1, where only the Python wrapper, the dispatcher,
autograd and argument checks remain. Last, one KV-cache decode step (8 query
heads on 2 KV heads, 4096 and 32768 cached keys, float32) with the K/V bytes
read per second.

Times are medians of --reps calls after --warmup calls, wall clock, with
torch.set_num_threads(--threads). Prints the CPU model, the ISA PyTorch's
kernels use (torch.backends.cpu.get_cpu_capability()) and the vector
extensions the CPU reports. Needs the package installed
(bash scripts/setup-python); not part of the test suite:

    ~/.cache/continuum/venv/bin/python bench/torch_attention.py [--reps 5]
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import continuum_attention as ca


def cpu_description():
    """The CPU's model (continuum_attention.cpu_model) and which of the listed
    instruction-set flags /proc/cpuinfo gives."""
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    wanted = ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16",
              "amx_bf16", "neon", "sve"]
    isa = [f for f in wanted if f in flags]
    return ca.cpu_model(), isa


def median_time(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_inputs(B, H, L, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.rand(B, H, L, D, generator=g, dtype=torch.float32).mul_(2).sub_(1).to(dtype)
                   for _ in range(4))
    return q, k, v, do


BASELINE = {torch.float32: "SDPA fp32", torch.bfloat16: "SDPA bf16"}
DTYPE_NAME = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def cases(dtypes, exact=False):
    """name -> (dtype, function of (q, k, v, causal)): ours and SDPA in each of
    dtypes, SDPA last in each (the baseline of its dtype)."""
    out = {}
    for dtype in dtypes:
        t = DTYPE_NAME[dtype]
        out[f"continuum {t}"] = (dtype, lambda q, k, v, c: ca.attention(q, k, v, causal=c))
        out[f"softmax (ours) {t}"] = (dtype, lambda q, k, v, c: ca.attention(q, k, v, kernel="softmax", causal=c))
        if exact and dtype == torch.float32:
            out["continuum fp32 compute=float64"] = (
                dtype, lambda q, k, v, c: ca.attention(q, k, v, causal=c, compute="float64"))
            out["softmax (ours) fp32 compute=float64"] = (
                dtype, lambda q, k, v, c: ca.attention(q, k, v, kernel="softmax", causal=c, compute="float64"))
        out[BASELINE[dtype]] = (dtype, lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c))
    return out


def run(B, H, L, D, reps, warmup, dtypes=(torch.float32, torch.bfloat16), backward_too=True, exact=False):
    """(name, causal, "fwd" | "fwd+bwd") -> (median seconds, dtype)."""
    results = {}
    for name, (dtype, f) in cases(dtypes, exact).items():
        q, k, v, do = make_inputs(B, H, L, D, dtype)
        for causal in (False, True):
            with torch.no_grad():
                results[(name, causal, "fwd")] = (median_time(lambda: f(q, k, v, causal), reps, warmup), dtype)
            if backward_too:
                qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

                def fwd_bwd():
                    out = f(qg, kg, vg, causal)
                    torch.autograd.grad(out, (qg, kg, vg), do)

                results[(name, causal, "fwd+bwd")] = (median_time(fwd_bwd, reps, warmup), dtype)
    return results


def print_table(results, unit, scale_to):
    """One line per (visibility, pass) and dtype; each cell is the time and
    SDPA's time in that dtype divided by it."""
    names = list(dict.fromkeys(n for n, _, _ in results))
    dtypes = list(dict.fromkeys(dt for _, dt in results.values()))
    for causal in (False, True):
        for what in ("fwd", "fwd+bwd"):
            for dtype in dtypes:
                base = results[(BASELINE[dtype], causal, what)][0]
                cells = []
                for n in names:
                    t, dt = results[(n, causal, what)]
                    if dt == dtype:
                        cells.append(f"{n}: {t * scale_to:9.3f} {unit} ({base / t:5.2f}x)")
                print(f"  {'causal' if causal else 'full  '} {what:8s} " + " | ".join(cells))


def decode(kv_lens, dim, reps, warmup):
    """One KV-cache decode step: a query row per head, 8 query heads on 2 KV
    heads (GQA), float32; ours with causal=True (bottom-right: the row sees
    every cached key), SDPA with enable_gqa=True and no mask (its is_causal is
    top-left aligned)."""
    out = {}
    for lk in kv_lens:
        g = torch.Generator().manual_seed(lk)
        q = torch.randn(1, 8, 1, dim, generator=g)
        k = torch.randn(1, 2, lk, dim, generator=g)
        v = torch.randn(1, 2, lk, dim, generator=g)
        kv_bytes = 2 * k.numel() * k.element_size()
        for name, f in (("continuum", lambda: ca.attention(q, k, v, kernel="continuum", causal=True)),
                        ("softmax (ours)", lambda: ca.attention(q, k, v, kernel="softmax", causal=True)),
                        ("SDPA", lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))):
            with torch.no_grad():
                out[(lk, name)] = (median_time(f, reps, warmup), kv_bytes)
    for lk in kv_lens:
        base = out[(lk, "SDPA")][0]
        cells = [f"{n}: {t * 1e6:8.1f} us ({base / t:4.2f}x, {b / t / 1e9:5.1f} GB/s of K/V)"
                 for (l2, n), (t, b) in out.items() if l2 == lk]
        print(f"  {lk:6d} cached keys  " + " | ".join(cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--exact", action="store_true",
                    help='also time compute="float64" (the kernels in double) at the main shape')
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, isa = cpu_description()
    print(f"CPU: {model}; {os.cpu_count()} logical CPUs; torch threads {torch.get_num_threads()}")
    print(f"ISA: continuum kernels {ca.cpu_isa()}; PyTorch CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; CPU flags {' '.join(isa) or 'none of the listed'}")
    print(f"torch {torch.__version__}, continuum_attention {ca.__version__}; "
          f"medians of {a.reps} after {a.warmup} warm-up; ratio = SDPA's time in the same dtype / this time")
    print(f"\nbatch 1, {a.heads} heads, seq {a.seq}, head_dim {a.dim}:")
    print_table(run(1, a.heads, a.seq, a.dim, a.reps, a.warmup, exact=a.exact), "ms", 1e3)
    print("\nper-call overhead, batch 1, 1 head, seq 64, head_dim 32 (medians of 200):")
    print_table(run(1, 1, 64, 32, 200, 20, dtypes=(torch.float32,)), "us", 1e6)
    print("\ndispatch floor, batch 1, 1 head, seq 1, head_dim 1 (no arithmetic to speak of; medians of 200):")
    print_table(run(1, 1, 1, 1, 200, 20, dtypes=(torch.float32,)), "us", 1e6)
    print(f"\ndecode step, 8 query heads on 2 KV heads, head_dim {a.dim}, fp32 (medians of 50; ratio = SDPA / ours):")
    decode((4096, 32768), a.dim, 50, 5)


if __name__ == "__main__":
    main()
