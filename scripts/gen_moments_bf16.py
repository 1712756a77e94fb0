#!/usr/bin/env python3
"""Coefficients of the CPU stencil's series regimes.

Prints, for include/continuum/backends/cpu/vector_moments.hpp:
* the forward weights' h(d) = (d - 1 + e^-d)/d^2 (docs/MATH.md §5, "The
  forward stencil in d"), interpolated at Chebyshev nodes in d, lowest power
  first: `h` of VectorMath<float> (d in [-2, 2], degree 10) and of
  VectorMath<double> (d in [-2, 2], degree 17), and `h_bf16` (d in
  [-1/4, 1/4], degree 3; docs/MATH.md §10, "The bfloat16 stencil");
* the arrays `nu2_bf16`, `mu2_bf16`, `kappa_bf16` of the backward terms: the
  Chebyshev interpolants, by mpmath.chebyfit at 60 digits, of the
  exponential moments of §5 as functions of b = -a on b in [0, 1/2] in
  t = b - 1/4 (degree 3).
Each with its largest error relative to the function's smallest value on the
interval.

Usage: python scripts/gen_moments_bf16.py   (needs mpmath, a dependency of
PyTorch in the project's virtual environment)
"""
import mpmath as mp

mp.mp.dps = 60


def moments(a):
    """nu, mu1, nu2, mu2, kappa at a < 0 (closed forms, §5's table)."""
    e = mp.exp(a)
    return {
        "nu": (mp.expm1(a) - a) / a**2,
        "mu1": (a * e - mp.expm1(a)) / a**2,
        "nu2": (a * a + 2 * a + 2 - 2 * e) / (-a) ** 3,
        "mu2": (2 - e * (a * a - 2 * a + 2)) / (-a) ** 3,
        "kappa": ((a - 2) * e + a + 2) / a**3,
    }


def fit(name, edge, degree):
    half = mp.mpf(edge) / 2

    def f(t):
        b = t + half
        return moments(-b)[name] if b != 0 else {"nu": mp.mpf(1) / 2, "mu1": mp.mpf(1) / 2,
                                                 "nu2": mp.mpf(1) / 3, "mu2": mp.mpf(1) / 3,
                                                 "kappa": mp.mpf(1) / 6}[name]

    coeffs, err = mp.chebyfit(f, [-half, half], degree + 1, error=True)
    smallest = min(f(-half + 2 * half * k / 200) for k in range(201))
    body = ", ".join(mp.nstr(c, 21) + "f" for c in reversed(coeffs))
    print(f"  // {name}: max relative error {float(err / smallest):.1e}")
    print(f"  static constexpr float {name}_bf16[{degree + 1}] = {{{body}}};")


def h(d):
    """(d - 1 + e^-d)/d^2 from its series (no cancellation near d = 0)."""
    d = mp.mpf(d)
    return mp.nsum(lambda k: (-d) ** k / (mp.factorial(k) * (k + 1) * (k + 2)), [0, mp.inf])


def fit_h(name, ctype, edge, degree):
    """h interpolated at degree + 1 Chebyshev nodes of [-edge, edge], in d."""
    n = degree + 1
    edge = mp.mpf(edge)
    nodes = [edge * mp.cos(mp.pi * (2 * k + 1) / (2 * n)) for k in range(n)]
    a = mp.matrix([[x**j for j in range(n)] for x in nodes])
    c = mp.lu_solve(a, mp.matrix([h(x) for x in nodes]))
    coeffs = [c[i] for i in range(n)]
    sweep = [-edge + 2 * edge * k / 1000 for k in range(1001)]
    err = max(abs(mp.polyval(list(reversed(coeffs)), x) - h(x)) / h(x) for x in sweep)
    suffix = "f" if ctype == "float" else ""
    body = ", ".join(mp.nstr(x, 21) + suffix for x in coeffs)
    print(f"  // {name} ({ctype}): max relative error {float(err):.1e}")
    print(f"  static constexpr {ctype} {name}[{n}] = {{{body}}};")


if __name__ == "__main__":
    mp.mp.dps = 80
    fit_h("h", "float", 2, 10)
    fit_h("h", "double", 2, 17)
    fit_h("h_bf16", "float", mp.mpf(1) / 4, 3)
    mp.mp.dps = 60
    for name in ("nu2", "mu2", "kappa"):
        fit(name, 0.5, 3)
