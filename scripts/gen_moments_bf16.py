#!/usr/bin/env python3
"""Coefficients of the CPU stencil's series regimes.

Prints the arrays of include/continuum/backends/cpu/vector_moments.hpp: the
segment functions of docs/MATH.md §5–§6 ("The forward stencil in d", "The
backward stencil in d") as functions of the
signed d = y - x, each from its Taylor series (no cancellation near d = 0),
interpolated at Chebyshev nodes of [-edge, edge] in d, lowest power first:

  h(d) = int_0^1 t e^{-d(1-t)} dt        (the forward weights)
  q(d) = int_0^1 t^2 e^{-d(1-t)} dt      (a weight's derivative by its own knot)
  k(d) = int_0^1 t (1-t) e^{d t} dt      (the coupling)

on [-2, 2] of degree 10 (float) and 17 (double), and at bfloat16 accuracy
(docs/MATH.md §10, "The bfloat16 stencil") h on [-1/4, 1/4] of degree 3 and
q, k on [-1/2, 1/2] of degree 4. Each with its largest error relative to the
function on the interval (1001 points).

It also prints the degree-5 polynomial of e^r in exp_stencil_bf16 (the bfloat16
stencil's knot exponentials), minimax in relative error on |r| <= ln2/2.

Usage: python scripts/gen_moments_bf16.py   (needs mpmath, a dependency of
PyTorch, and scipy, both in the project's virtual environment)
"""
import mpmath as mp

mp.mp.dps = 80


def series(term):
    return lambda d: mp.nsum(lambda k: term(mp.mpf(d), k), [0, mp.inf])


FUNCTIONS = {
    "h": series(lambda d, k: (-d) ** k / (mp.factorial(k) * (k + 1) * (k + 2))),
    "q": series(lambda d, k: (-d) ** k * 2 / (mp.factorial(k) * (k + 1) * (k + 2) * (k + 3))),
    "k": series(lambda d, k: d**k / (mp.factorial(k) * (k + 2) * (k + 3))),
}


def fit(name, ctype, edge, degree, suffix=""):
    """FUNCTIONS[name] interpolated at degree + 1 Chebyshev nodes of [-edge, edge]."""
    f = FUNCTIONS[name]
    n = degree + 1
    edge = mp.mpf(edge)
    nodes = [edge * mp.cos(mp.pi * (2 * j + 1) / (2 * n)) for j in range(n)]
    a = mp.matrix([[x**j for j in range(n)] for x in nodes])
    c = mp.lu_solve(a, mp.matrix([f(x) for x in nodes]))
    coeffs = [c[i] for i in range(n)]
    sweep = [-edge + 2 * edge * j / 1000 for j in range(1001)]
    err = max(abs(mp.polyval(list(reversed(coeffs)), x) - f(x)) / f(x) for x in sweep)
    body = ", ".join(mp.nstr(x, 21) + ("f" if ctype == "float" else "") for x in coeffs)
    print(f"  // {name}{suffix} ({ctype}, [-{mp.nstr(edge, 3)}, {mp.nstr(edge, 3)}]): max relative error {float(err):.1e}")
    print(f"  static constexpr {ctype} {name}{suffix}[{n}] = {{{body}}};")


def fit_exp(degree=5):
    """exp_stencil_bf16's e^r on |r| <= ln2/2 (docs/MATH.md §10, "The bfloat16
    stencil"): 1 + c1 r + ... + c_degree r^degree, minimax in relative error on a
    dense grid (a linear program, scipy), rounded to float, lowest power first."""
    import numpy as np
    from scipy.optimize import linprog

    half = np.log(2) / 2 * 1.0001  # t's rounding can pick the neighbouring n
    r = np.linspace(-half, half, 4001)
    a = np.stack([r**k for k in range(1, degree + 1)], 1) / np.exp(r)[:, None]
    b = 1 - np.exp(-r)  # p(r) e^-r - 1 = a c - b, kept within [-t, t]
    ones = np.ones((len(r), 1))
    res = linprog(np.r_[np.zeros(degree), 1], A_ub=np.block([[a, -ones], [-a, -ones]]), b_ub=np.r_[b, -b],
                  bounds=[(None, None)] * degree + [(0, None)], method="highs")
    coeffs = [float(np.float32(c)) for c in res.x[:degree]]
    body = ", ".join(repr(c) + "f" for c in coeffs)
    print(f"  // exp_stencil_bf16: e^r ~ 1 + c1 r + ... + c{degree} r^{degree} on |r| <= ln2/2, max relative error"
          f" {res.x[-1]:.1e} before rounding")
    print(f"  // c1 ... c{degree} = {body}")


if __name__ == "__main__":
    for name in ("h", "q", "k"):
        fit(name, "float", 2, 10)
    for name in ("h", "q", "k"):
        fit(name, "double", 2, 17)
    fit("h", "float", mp.mpf(1) / 4, 3, "_bf16")
    for name in ("q", "k"):
        fit(name, "float", mp.mpf(1) / 2, 4, "_bf16")
    fit_exp()
