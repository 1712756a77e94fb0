// math/moments.hpp — the closed-form exponential moments of MATH.md §5.
//
// Every weight of Continuum Attention reduces to bounded one-argument functions
// of a ≤ 0 (the larger endpoint score is factored out, a = -|x - y|); b = -a:
//
//   mu0(a)   = ∫_0^1 e^{au} du            = expm1(a)/a
//   mu1(a)   = ∫_0^1 u e^{au} du          = (1 - e^{-b}(1 + b))/b²
//   mu2(a)   = ∫_0^1 u² e^{au} du         = (2 - e^{-b}(b² + 2b + 2))/b³
//   nu(a)    = ∫_0^1 (1-u) e^{au} du      = (b - 1 + e^{-b})/b²          = mu0 - mu1
//   kappa(a) = ∫_0^1 u(1-u) e^{au} du     = (b - 2 + (b + 2) e^{-b})/b³  = mu1 - mu2
//   nu2(a)   = ∫_0^1 (1-u)² e^{au} du     = (b² - 2b + 2 - 2e^{-b})/b³  = nu - kappa
//
// mu2 and nu2 are ∂w/∂x of a segment weight (MATH.md §5). The shift identity
// ∂w/∂x = w - ∂w/∂y (§5 [choice]) gives, for the far weight, μ1 - κ = μ2:
// each term ~1/b², the difference ~2/b³, so the subtraction loses log2(b/2)
// bits (all of them as b → ∞; tests/unit/test_curve.cpp measures it). We
// evaluate μ2 and ν2 directly instead.
//
// Evaluation, all in double (float arguments are promoted, evaluated in double
// and rounded once: ≤ 0.5 ulp + 2^-28 ulp in float):
//  * b < 7.5: Taylor expansion about the nearest integer point -k (k = 0..7,
//    |h| = |a + k| ≤ 1/2, h exact by Sterbenz), coefficients f^(m)(-k)/m! from
//    scripts/gen_moments_taylor.py (mpmath, 160 digits, rounded once; 15–17 terms,
//    tail < 2^-60·f). The constant term is a double-double and the last Horner
//    step is hi + fma(h, S, lo), so the result carries one rounding plus the
//    tail's error damped by |h f'/f| ≤ 3/8. No exp, no cancellation.
//    Why 7.5: below it the closed forms cancel (μ1's numerator 1 - e^{-b}(1+b)
//    ~ b²/2 loses log2(4/b) bits, κ's b - 2 + (b+2)e^{-b} ~ b³/6 loses
//    log2(24/b³)). With the double-double numerators below they are already
//    ≤ 1.2 ulp from b ≥ 4.5 (measured: moving the switch to 2.5 makes μ2 2.8 ulp);
//    at b ≥ 7.5 the e^{-b} terms weigh ≤ 0.02 of every numerator, so even a
//    1–2 ulp exp (CUDA documents ≤ 1 ulp for double exp and expm1)
//    adds ≤ 0.04 ulp. Interval width 1 keeps |h f'/f| ≤ 3/8 (f'/f is the mean
//    of u under the weight w(u)e^{au}, at most 3/4 (μ2 at a = 0)), so the
//    Horner tail's rounding is damped by 8/3.
//  * b ≥ 7.5: the closed forms above with the numerator held as a double-double
//    (error-free two_sum / fma products) and the division by b², b³ done as a
//    chain of divisions by b whose remainders are recovered exactly with fma:
//    one final rounding, and a², a³ are never formed (they would overflow at
//    |a| > 1.3e154 / 5.6e102).
//  * a = 0 (either sign) gives the exact limits 1, 1/2, 1/3, 1/2, 1/6, 1/3;
//    a = -∞ gives 0; NaN in gives NaN out. Every function lies in [0, 1].
//  * a > 0 is outside the domain (callers never form it); results there are
//    finite for 0 < a ≤ 1/2 (the k = 0 series) and otherwise not specified,
//    except μ0, which is expm1(a)/a for every a > 0 (≤ 1.5 ulp with glibc):
//    MATH.md §7.7 uses it at y - x > 0.
//
// Accuracy (tests/unit/test_moments.cpp, 220 172 arguments per function and type
// against 400-bit MPFR of the same rounded input; glibc exp/expm1, x86-64):
//            mu0   mu1   mu2   nu    kappa nu2
//   double   0.81  1.16  1.20  0.75  0.81  0.74   max ulp (1e6 more, other seed: ≤ 1.27)
//   float    0.50  0.50  0.50  0.50  0.50  0.50
// The bound asserted there is 2 ulp in float and double.
// Host/device: no tables, no statics, no exceptions (the coefficients are
// literals inside switch statements), so every function compiles for CUDA.
#pragma once

#include "../config.hpp"
#include "moments_taylor.hpp"

namespace continuum {
namespace detail {

/// b at and beyond which the closed forms are used (the Taylor tables cover
/// [0, taylor_limit)); see the header comment for the derivation.
inline constexpr double taylor_limit = taylor_intervals - 0.5;

/// An unevaluated sum hi + lo, |lo| ≤ ulp(hi)/2 (or a little more).
struct DoubleDouble {
  double hi, lo;
};

/// hi + lo = x + y exactly when |x| ≥ |y| (Dekker's fast two-sum).
CONTINUUM_HOST_DEVICE inline DoubleDouble fast_two_sum(double x, double y) {
  const double s = x + y;
  return {s, y - (s - x)};
}

/// (n.hi + n.lo) / b as a double-double: the remainder n.hi - q·b is exact
/// (fma) whenever q is normal, so the quotient carries ~2^-104 relative error.
CONTINUUM_HOST_DEVICE inline DoubleDouble div_by(DoubleDouble n, double b) {
  const double q = n.hi / b;
  const double r = math::fma(-q, b, n.hi);
  return {q, (r + n.lo) / b};
}

/// Rounds n / b^k to double, b > 0 finite, never forming b^k.
CONTINUUM_HOST_DEVICE inline double div_by_pow(DoubleDouble n, double b, int k) {
  for (int i = 0; i < k; ++i) n = div_by(n, b);
  return n.hi + n.lo;
}

/// Index of the Taylor interval for b < taylor_limit: the nearest integer,
/// 0 for b < 1/2 (including a > 0).
CONTINUUM_HOST_DEVICE inline int taylor_index(double b) {
  return b < 0.5 ? 0 : int(b + 0.5);
}

CONTINUUM_HOST_DEVICE inline double mu0(double a) {
  const double b = -a;
  if (b < 0.0) return math::expm1(a) / a;  // a > 0: MATH.md §7.7 writes e^x μ0(y - x)
  if (b < taylor_limit) {
    const int k = taylor_index(b);
    return taylor_mu0(k, a + double(k));
  }
  if (!(b < __builtin_huge_val())) return b == b ? 0.0 : a;
  // (1 - e^{-b}) / b: the e^{-b} term is ≤ 5.6e-4 of the numerator.
  return div_by_pow(fast_two_sum(1.0, -math::exp(a)), b, 1);
}

CONTINUUM_HOST_DEVICE inline double mu1(double a) {
  const double b = -a;
  if (b < taylor_limit) {
    const int k = taylor_index(b);
    return taylor_mu1(k, a + double(k));
  }
  if (!(b < __builtin_huge_val())) return b == b ? 0.0 : a;  // -∞ → 0; NaN → NaN
  // (1 - e^{-b} - b e^{-b}) / b²
  const double e = math::exp(a);
  const double p = e * b, pe = math::fma(e, b, -p);  // p + pe = b e^{-b} exactly
  const DoubleDouble t = fast_two_sum(p, e);          // b ≥ 7.5 > 1: |p| ≥ |e|
  const DoubleDouble n = fast_two_sum(1.0, -t.hi);
  return div_by_pow({n.hi, n.lo - (t.lo + pe)}, b, 2);
}

CONTINUUM_HOST_DEVICE inline double mu2(double a) {
  const double b = -a;
  if (b < taylor_limit) {
    const int k = taylor_index(b);
    return taylor_mu2(k, a + double(k));
  }
  if (!(b < __builtin_huge_val())) return b == b ? 0.0 : a;
  // (2 - e^{-b}((b + 2) b + 2)) / b³; the e^{-b} term is ≤ 0.02 of the numerator
  // (so its own few roundings cost ≤ 0.06 ulp) and is 0 before b² could overflow.
  const double e = math::exp(a);
  const double t = e == 0.0 ? 0.0 : e * ((b + 2.0) * b + 2.0);
  return div_by_pow(fast_two_sum(2.0, -t), b, 3);
}

CONTINUUM_HOST_DEVICE inline double nu(double a) {
  const double b = -a;
  if (b < taylor_limit) {
    const int k = taylor_index(b);
    return taylor_nu(k, a + double(k));
  }
  if (!(b < __builtin_huge_val())) return b == b ? 0.0 : a;
  // (b - 1 + e^{-b}) / b²
  const DoubleDouble s = fast_two_sum(b, -1.0);
  const DoubleDouble n = fast_two_sum(s.hi, math::exp(a));
  return div_by_pow({n.hi, n.lo + s.lo}, b, 2);
}

CONTINUUM_HOST_DEVICE inline double kappa(double a) {
  const double b = -a;
  if (b < taylor_limit) {
    const int k = taylor_index(b);
    return taylor_kappa(k, a + double(k));
  }
  if (!(b < __builtin_huge_val())) return b == b ? 0.0 : a;
  // (b - 2 + (b + 2) e^{-b}) / b³; the e^{-b} term is ≤ 1e-3 of the numerator.
  const DoubleDouble s = fast_two_sum(b, -2.0);
  const DoubleDouble n = fast_two_sum(s.hi, (b + 2.0) * math::exp(a));
  return div_by_pow({n.hi, n.lo + s.lo}, b, 3);
}

CONTINUUM_HOST_DEVICE inline double nu2(double a) {
  const double b = -a;
  if (b < taylor_limit) {
    const int k = taylor_index(b);
    return taylor_nu2(k, a + double(k));
  }
  if (!(b < __builtin_huge_val())) return b == b ? 0.0 : a;
  // ((b - 2) + (2 - 2e^{-b})/b) / b²  (= (b² - 2b + 2 - 2e^{-b})/b³ without b²);
  // the quotient term is ≤ 0.05 of the sum, so its two roundings cost ≤ 0.1 ulp.
  const DoubleDouble s = fast_two_sum(b, -2.0);
  const DoubleDouble n = fast_two_sum(s.hi, (2.0 - 2.0 * math::exp(a)) / b);
  return div_by_pow({n.hi, n.lo + s.lo}, b, 2);
}

}  // namespace detail

/// μ0(a) = ∫_0^1 e^{au} du = expm1(a)/a (MATH.md §5), the mass of a whole segment
/// over e^{max}. \tparam T float or double (evaluated in double, rounded once).
/// Domain a ≤ 0 (and any a > 0, as expm1(a)/a); μ0(±0) = 1 exactly,
/// μ0(-∞) = 0, ~1/|a| as a → -∞; NaN → NaN.
template <class T>
CONTINUUM_HOST_DEVICE inline T mu0(T a) { return T(detail::mu0(double(a))); }

/// μ1(a) = ∫_0^1 u e^{au} du (MATH.md §5): the "far" segment weight over e^{max}.
/// Domain a ≤ 0; μ1(±0) = 1/2, μ1(-∞) = 0, ~1/a² as a → -∞; NaN → NaN.
template <class T>
CONTINUUM_HOST_DEVICE inline T mu1(T a) { return T(detail::mu1(double(a))); }

/// μ2(a) = ∫_0^1 u² e^{au} du: ∂w/∂x of the far segment weight (MATH.md §5,
/// evaluated directly: see the header comment). μ2(±0) = 1/3, μ2(-∞) = 0, ~2/|a|³; NaN → NaN.
template <class T>
CONTINUUM_HOST_DEVICE inline T mu2(T a) { return T(detail::mu2(double(a))); }

/// ν(a) = ∫_0^1 (1-u) e^{au} du = μ0 - μ1 (MATH.md §5): the "near" segment weight.
/// ν(±0) = 1/2, ν(-∞) = 0, ~1/|a| as a → -∞; NaN → NaN.
template <class T>
CONTINUUM_HOST_DEVICE inline T nu(T a) { return T(detail::nu(double(a))); }

/// κ(a) = ∫_0^1 u(1-u) e^{au} du = μ1 - μ2 (MATH.md §5): ∂w/∂y of a segment.
/// κ(±0) = 1/6, κ(-∞) = 0, ~1/a² as a → -∞; NaN → NaN.
template <class T>
CONTINUUM_HOST_DEVICE inline T kappa(T a) { return T(detail::kappa(double(a))); }

/// ν2(a) = ∫_0^1 (1-u)² e^{au} du = ν - κ (MATH.md §5): ∂w/∂x of the near segment weight.
/// ν2(±0) = 1/3, ν2(-∞) = 0, ~1/|a| as a → -∞; NaN → NaN.
template <class T>
CONTINUUM_HOST_DEVICE inline T nu2(T a) { return T(detail::nu2(double(a))); }

}  // namespace continuum
