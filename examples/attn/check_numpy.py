#!/usr/bin/env python3
"""Cross-check continuum-attn's outputs with an independent NumPy evaluation.

Developer tool (needs NumPy; the CTest suite does not use it):

    continuum-attn --q IN/q.npy --k IN/k.npy --v IN/v.npy [--do IN/do.npy] \
                   --causal --temperature 0.3 --out OUT
    python3 examples/attn/check_numpy.py IN OUT --causal --temperature 0.3

Evaluates MATH.md §4 in float64, by default as Gauss-Legendre quadrature of the
piecewise-linear curve (32 nodes per segment), or with --method stencil from
the textbook closed forms (np.expm1); those lose digits when neighbouring
scores are nearly equal (MATH.md §5), which is why the library does not use them
as they stand. Also
dV = P^T dO (MATH.md §6) when IN/do.npy and OUT/dv.npy exist, and prints the
largest absolute differences. Supports 2-D and 4-D inputs, GQA, causal
(bottom-right) and window; a scalar or per-head/per-query .npy temperature;
not explicit ranges. Exits 1 if any difference exceeds --tol, after one line on
stderr naming each array that does and by how much.

The default --tol (1e-10) is for float64 inputs. float32 inputs compute in
float32 by default (continuum-attn's tiled kernels; differences ~1e-6 of the
largest value) and in float64 with `--compute float64` (~1e-7: one float32
rounding, plus the temperature's rounding to float32): pass --tol 1e-5 for
either. The NumPy evaluation takes the temperature in float64 as given.
"""
import argparse
import os
import sys

import numpy as np


def as4(x):
    return x[None, None] if x.ndim == 2 else x


def visible(i, lq, lk, causal, left, right):
    """[lo, hi) of query i: causal bottom-right, window (left, right) around the
    diagonal key d = i + lk - lq, a negative bound unlimited (docs/MATH.md §3)."""
    d = i + lk - lq
    hi = min(lk, d + 1) if causal else lk
    lo = 0
    if left >= 0:
        lo = max(lo, d - left)
    if right >= 0:
        hi = min(hi, d + right + 1)
    return lo, max(lo, hi)


def nu(a):  # ∫(1-u) e^{au} du, a <= 0
    return np.where(a == 0, 0.5, (np.expm1(a) - a) / np.where(a == 0, 1, a * a))


def mu1(a):  # ∫ u e^{au} du
    return np.where(a == 0, 0.5, (a * np.exp(a) - np.expm1(a)) / np.where(a == 0, 1, a * a))


def w(x, y):  # segment weight toward the knot with score x (MATH.md §5)
    m = np.maximum(x, y)
    a = -np.abs(x - y)
    return np.exp(m) * np.where(x >= y, nu(a), mu1(a))


def row_weights(s, kernel, method):
    """Unnormalised weights α_j (shifted by max) for one row's visible scores s."""
    s = s - s.max()
    if kernel != "continuum":
        return np.exp(s)
    n = len(s)
    alpha = np.zeros(n)
    if method == "stencil":
        for j in range(n):
            left = w(s[j], s[j - 1]) if j > 0 else np.exp(s[j]) / 2
            right = w(s[j], s[j + 1]) if j + 1 < n else np.exp(s[j]) / 2
            alpha[j] = left + right
        return alpha
    # quadrature of the curve: each segment's (1-u) and u shares of ∫ e^{s(u)} du
    x, g = np.polynomial.legendre.leggauss(32)
    u, g = (x + 1) / 2, g / 2
    alpha[0] += np.exp(s[0]) / 2
    alpha[-1] += np.exp(s[-1]) / 2
    for j in range(n - 1):
        e = np.exp((1 - u) * s[j] + u * s[j + 1])
        alpha[j] += np.sum(g * (1 - u) * e)
        alpha[j + 1] += np.sum(g * u * e)
    return alpha


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs")
    ap.add_argument("outputs")
    ap.add_argument("--kernel", default="continuum", choices=["continuum", "softmax", "focal"])
    ap.add_argument("--temperature", default="1")
    ap.add_argument("--scale", type=float)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--window", type=int, default=0, help="W keys counting the diagonal: (W - 1, 0)")
    ap.add_argument("--window-left", type=int, default=-1)
    ap.add_argument("--window-right", type=int, default=-1)
    ap.add_argument("--method", default="quadrature", choices=["stencil", "quadrature"])
    ap.add_argument("--tol", type=float, default=1e-10)
    a = ap.parse_args()
    if a.window > 0:
        a.window_left, a.window_right = a.window - 1, 0

    load = lambda d, n: np.load(os.path.join(d, n)).astype(np.float64)
    q, k, v = (as4(load(a.inputs, n + ".npy")) for n in "qkv")
    o = as4(load(a.outputs, "o.npy"))
    lse = load(a.outputs, "lse.npy").reshape(o.shape[:3])
    B, H, Lq, D = q.shape
    Hk, Lk = k.shape[1], k.shape[2]
    scale = a.scale if a.scale is not None else 1 / np.sqrt(D)
    try:
        tau = np.full((B, H, Lq), float(a.temperature))
    except ValueError:
        t = np.load(a.temperature).astype(np.float64)
        tau = np.broadcast_to(t.reshape(1, H, 1) if t.size == H and t.ndim == 1 and q.ndim == 4 else
                              t.reshape(B, H, Lq) if t.size == B * H * Lq else t.reshape(()), (B, H, Lq))

    has_do = os.path.exists(os.path.join(a.inputs, "do.npy")) and os.path.exists(os.path.join(a.outputs, "dv.npy"))
    if has_do:
        do = as4(load(a.inputs, "do.npy"))
        dv_ref = np.zeros_like(v)
    o_ref = np.zeros_like(o)
    lse_ref = np.full((B, H, Lq), -np.inf)
    for b in range(B):
        for h in range(H):
            hk = h // (H // Hk)
            for i in range(Lq):
                lo, hi = visible(i, Lq, Lk, a.causal, a.window_left, a.window_right)
                if hi <= lo:
                    continue
                s = scale / tau[b, h, i] * (k[b, hk, lo:hi] @ q[b, h, i])
                alpha = row_weights(s, a.kernel, a.method)
                p = alpha / alpha.sum()
                o_ref[b, h, i] = p @ v[b, hk, lo:hi]
                lse_ref[b, h, i] = s.max() + np.log(alpha.sum())
                if has_do:
                    dv_ref[b, hk, lo:hi] += np.outer(p, do[b, h, i])

    def err(x, y):
        fin = np.isfinite(y)
        if np.any((x != y) & ~fin):
            return np.inf
        return float(np.max(np.abs(x - y)[fin], initial=0.0))

    over = []  # (name, difference) above --tol; NaN counts as above
    checks = [("o", o, o_ref), ("lse", lse, lse_ref)]
    if has_do:
        checks.append(("dv", as4(load(a.outputs, "dv.npy")), dv_ref))
    for name, got, ref in checks:
        e = err(got, ref)
        if not e <= a.tol:
            over.append((name, e))
        print(f"{name:4s} max |continuum-attn - numpy ({a.method})| = {e:.3e}")
    if over:
        print("check_numpy.py: FAILED: " + "; ".join(
            f"{name} differs by {e:.3e} > --tol {a.tol:.3e} (by {e - a.tol:.3e})" for name, e in over),
            file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
