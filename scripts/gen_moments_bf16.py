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

Usage: python scripts/gen_moments_bf16.py   (needs mpmath, a dependency of
PyTorch in the project's virtual environment)
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


if __name__ == "__main__":
    for name in ("h", "q", "k"):
        fit(name, "float", 2, 10)
    for name in ("h", "q", "k"):
        fit(name, "double", 2, 17)
    fit("h", "float", mp.mpf(1) / 4, 3, "_bf16")
    for name in ("q", "k"):
        fit(name, "float", mp.mpf(1) / 2, 4, "_bf16")
