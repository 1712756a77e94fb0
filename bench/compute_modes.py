#!/usr/bin/env python3
"""Speed and accuracy of each storage/compute pair of the CPU operator.

Runs `continuum_attention.attention` on one problem (default: batch 16, 4
heads, seq 192, head_dim 32, causal, tau = 0.25, the continuum kernel) with
float32 storage and compute=None (float32 arithmetic) and compute="float64",
and with float64 storage; prints the median forward and forward+backward
times over --reps runs, side by side in one process, and the errors of out,
dq, dk, dv relative to each tensor's largest element, against float64
storage on the same (float32-rounded) inputs. Also prints the CPU model and
the instruction set of the kernels (continuum_attention.cpu_isa()).

    python bench/compute_modes.py [--threads 2] [--reps 9] [--kernel continuum]
"""
import argparse
import statistics
import time

import torch

from continuum_attention import attention, cpu_isa, cpu_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=192)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--tau", type=float, default=0.25)
    p.add_argument("--kernel", default="continuum", choices=["continuum", "softmax", "focal"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=9)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    shape = (a.batch, a.heads, a.seq, a.dim)
    q, k, v, do = (torch.randn(shape, generator=g) for _ in range(4))

    def run(dtype, compute):
        x = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
        fwd, both = [], []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            out = attention(*x, kernel=a.kernel, causal=True, temperature=a.tau, compute=compute)
            t1 = time.perf_counter()
            grads = torch.autograd.grad(out, x, do.to(dtype))
            t2 = time.perf_counter()
            fwd.append(t1 - t0)
            both.append(t2 - t0)
        return statistics.median(fwd), statistics.median(both), [out.detach(), *grads]

    ref = run(torch.float64, None)[2]
    print(f"CPU: {cpu_model()}; kernels {cpu_isa()}; torch {torch.__version__}, {a.threads} threads; kernel {a.kernel}, "
          f"B={a.batch} H={a.heads} L={a.seq} D={a.dim}, causal, tau={a.tau}, medians of {a.reps}")
    print("| storage, compute | forward ms | forward + backward ms | out | dq | dk | dv |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for dtype, compute, label in ((torch.float32, None, "float32, default (float32)"),
                                  (torch.float32, "float64", "float32, float64"),
                                  (torch.float64, None, "float64, default (float64)")):
        f, b, res = run(dtype, compute)
        errs = [((r.double() - x).abs().max() / x.abs().max()).item() for r, x in zip(res, ref)]
        print(f"| {label} | {1e3 * f:.1f} | {1e3 * b:.1f} | " + " | ".join(f"{e:.1e}" for e in errs) + " |")


if __name__ == "__main__":
    main()
