#!/usr/bin/env python3
"""Coefficients of the bfloat16-accuracy series regime of the CPU stencil.

Prints the arrays `nu_bf16` … `kappa_bf16` of VectorMath<float>
(include/continuum/backends/cpu/vector_moments.hpp; docs/MATH.md §10, "The
bfloat16 stencil"): the Chebyshev interpolants, by mpmath.chebyfit at 60
digits, of the exponential moments of §5 as functions of b = -a, on
b in [0, 1/4] in t = b - 1/8 (nu, mu1: degree 2) and on b in [0, 1/2] in
t = b - 1/4 (nu2, mu2, kappa: degree 3), lowest power first, each with its
largest error relative to the function's smallest value on the interval.

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


if __name__ == "__main__":
    for name in ("nu", "mu1"):
        fit(name, 0.25, 2)
    for name in ("nu2", "mu2", "kappa"):
        fit(name, 0.5, 3)
