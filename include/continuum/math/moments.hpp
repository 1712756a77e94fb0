// math/moments.hpp — the closed-form exponential moments of SPEC §5.
//
// Every weight of Continuum Attention reduces to bounded one-argument functions
// of a ≤ 0 (the larger endpoint score is factored out, a = -|x - y|):
//
//   mu0(a)   = ∫_0^1 e^{au} du            = expm1(a)/a
//   mu1(a)   = ∫_0^1 u e^{au} du          = (a e^a - expm1(a))/a²
//   mu2(a)   = ∫_0^1 u² e^{au} du         = (e^a (a² - 2a + 2) - 2)/a³
//   nu(a)    = ∫_0^1 (1-u) e^{au} du      = (expm1(a) - a)/a²          = mu0 - mu1
//   kappa(a) = ∫_0^1 u(1-u) e^{au} du     = ((a-2) e^a + a + 2)/a³     = mu1 - mu2
//   nu2(a)   = ∫_0^1 (1-u)² e^{au} du     = (a² + 2a + 2 - 2 e^a)/(-a³) = nu - kappa
//
// mu2 and nu2 are not in SPEC §5's table: they are the two derivatives
// ∂w/∂x of a segment weight (SPEC §5 writes ∂w/∂x = w - ∂w/∂y, which cancels
// catastrophically for the far weight, mu1 - kappa = mu2 ~ 2/|a|³ while each
// term ~ 1/a²), so we evaluate them directly.
//
// Evaluation (all functions, a ≤ 0; b = -a ≥ 0):
//  * b ≤ B (threshold per function and type, below): the mirror identity
//    ∫ f(u) e^{au} = e^{a} ∫ f(1-u) e^{bu} turns each function into e^{a}
//    times a power series in b with *positive* coefficients, summed by Horner:
//    no cancellation, a few ulp at most.
//  * b > B: the closed form above, rearranged so that no a² or a³ is formed
//    (they overflow near |a| ≈ 1.3e154 / 5.6e102 in double, 1.8e19 / 7e12 in
//    float); terms that cancel are kept apart until they no longer cancel.
//  * a = 0 gives the exact limits 1, 1/2, 1/3, 1/2, 1/6, 1/3; a = -∞ gives 0;
//    NaN in gives NaN out. Every function lies in [0, 1] for a ≤ 0.
//  * a > 0 is outside the domain (the callers never form it); results there
//    are not specified.
//
// Accuracy: measured against MPFR (200 bits) by tests/unit/test_moments.cpp,
// which prints the max ulp seen per function and type.
#pragma once

#include "../config.hpp"

namespace continuum {
namespace detail {

/// Horner sum of a series Σ_{m=0}^{N-1} c_m b^m with c_m = g(m)/m!, the
/// coefficients computed in T at each call from the recurrence (exact
/// rationals rounded once each); N is the number of terms needed for b ≤ B.
template <class T, int N, class G>
CONTINUUM_HOST_DEVICE inline T positive_series(T b, G g) {
  // c_m = g(m) / m!, evaluated from the top: s = c_{N-1}; s = s·b + c_m.
  // m! for m < 35 is exactly representable in double up to 22!, beyond that
  // rounded once; coefficients then carry ≤ 1 ulp each, and a positive-term
  // Horner sum adds at most ~1 ulp overall.
  T fact[N];
  T f = T(1);
  for (int m = 0; m < N; ++m) {
    if (m > 0) f *= T(m);
    fact[m] = f;
  }
  T s = g(N - 1) / fact[N - 1];
  for (int m = N - 2; m >= 0; --m) s = s * b + g(m) / fact[m];
  return s;
}

/// Series thresholds and term counts. B is where the closed form stops
/// losing more than ~1 ulp to cancellation (measured; see the test);
/// N is the smallest count with B^N/N! · (tail factor) < ε/4.
template <class T> struct moment_series;
template <> struct moment_series<double> {
  static constexpr double B = 4.0;
  static constexpr int N = 32;
};
template <> struct moment_series<float> {
  static constexpr float B = 4.0f;
  static constexpr int N = 19;
};

}  // namespace detail

/// μ0(a) = ∫_0^1 e^{au} du = expm1(a)/a (SPEC §5). Domain a ≤ 0; μ0(0) = 1,
/// μ0(-∞) = 0. expm1 and one division: ≤ 1.5 ulp wherever expm1 is correct.
template <class T>
CONTINUUM_HOST_DEVICE inline T mu0(T a) {
  if (a == T(0)) return T(1);
  return math::expm1(a) / a;
}

/// μ1(a) = ∫_0^1 u e^{au} du (SPEC §5). Domain a ≤ 0; μ1(0) = 1/2, ~1/a² as a → -∞.
template <class T>
CONTINUUM_HOST_DEVICE inline T mu1(T a) {
  if (math::isnan(a)) return a;
  const T b = -a;
  if (b == T(__builtin_huge_valf())) return T(0);
  if (b <= detail::moment_series<T>::B) {
    // μ1(a) = e^a ν(b) = e^a Σ b^m / (m! (m+1)(m+2))
    return math::exp(a) * detail::positive_series<T, detail::moment_series<T>::N>(
                              b, [](int m) { return T(1) / (T(m + 1) * T(m + 2)); });
  }
  // (a e^a - expm1(a)) / a², grouped as ((e^a·a - expm1 a)/a)/a; e^a·a → 0 for a = -∞.
  const T ea = math::exp(a);
  const T t = ea == T(0) ? T(0) : ea * a;
  return ((t - math::expm1(a)) / a) / a;
}

/// μ2(a) = ∫_0^1 u² e^{au} du. Domain a ≤ 0; μ2(0) = 1/3, ~2/|a|³ as a → -∞.
template <class T>
CONTINUUM_HOST_DEVICE inline T mu2(T a) {
  if (math::isnan(a)) return a;
  const T b = -a;
  if (b == T(__builtin_huge_valf())) return T(0);
  if (b <= detail::moment_series<T>::B) {
    // μ2(a) = e^a ν2(b) = e^a Σ b^m · 2 / (m! (m+1)(m+2)(m+3))
    return math::exp(a) * detail::positive_series<T, detail::moment_series<T>::N>(
                              b, [](int m) { return T(2) / (T(m + 1) * T(m + 2) * T(m + 3)); });
  }
  // Integration by parts: μ2 = (e^a - 2 μ1(a)) / a = (2 μ1(a) - e^a) / b.
  return (T(2) * mu1(a) - math::exp(a)) / b;
}

/// ν(a) = ∫_0^1 (1-u) e^{au} du = μ0 - μ1 (SPEC §5, the "near" segment weight).
/// Domain a ≤ 0; ν(0) = 1/2, ~ -1/a as a → -∞.
template <class T>
CONTINUUM_HOST_DEVICE inline T nu(T a) {
  if (math::isnan(a)) return a;
  const T b = -a;
  if (b == T(__builtin_huge_valf())) return T(0);
  if (b <= detail::moment_series<T>::B) {
    // ν(a) = e^a μ1(b) = e^a Σ b^m / (m! (m+2))
    return math::exp(a) * detail::positive_series<T, detail::moment_series<T>::N>(
                              b, [](int m) { return T(1) / T(m + 2); });
  }
  // (expm1(a) - a)/a² = (b + expm1(a)) / b / b
  return ((b + math::expm1(a)) / b) / b;
}

/// κ(a) = ∫_0^1 u(1-u) e^{au} du = μ1 - μ2 (SPEC §5; ∂w/∂y of a segment).
/// Domain a ≤ 0; κ(0) = 1/6, ~1/a² as a → -∞.
template <class T>
CONTINUUM_HOST_DEVICE inline T kappa(T a) {
  if (math::isnan(a)) return a;
  const T b = -a;
  if (b == T(__builtin_huge_valf())) return T(0);
  if (b <= detail::moment_series<T>::B) {
    // κ(a) = e^a κ(b) = e^a Σ b^m / (m! (m+2)(m+3))
    return math::exp(a) * detail::positive_series<T, detail::moment_series<T>::N>(
                              b, [](int m) { return T(1) / (T(m + 2) * T(m + 3)); });
  }
  // ((a-2)e^a + a + 2)/a³ = ((b - 2) + (b + 2) e^a) / b³ ; both terms ≥ 0 for b > 2.
  const T ea = math::exp(a);
  const T t = ea == T(0) ? T(0) : (b + T(2)) * ea;
  return (((b - T(2)) + t) / b / b) / b;
}

/// ν2(a) = ∫_0^1 (1-u)² e^{au} du = ν - κ (∂w/∂x of a segment seen from its
/// larger end). Domain a ≤ 0; ν2(0) = 1/3, ~ -1/a as a → -∞.
template <class T>
CONTINUUM_HOST_DEVICE inline T nu2(T a) {
  if (math::isnan(a)) return a;
  const T b = -a;
  if (b == T(__builtin_huge_valf())) return T(0);
  if (b <= detail::moment_series<T>::B) {
    // ν2(a) = e^a μ2(b) = e^a Σ b^m / (m! (m+3))
    return math::exp(a) * detail::positive_series<T, detail::moment_series<T>::N>(
                              b, [](int m) { return T(1) / T(m + 3); });
  }
  // ((b-1)² + 1 - 2 e^a) / b³, formed without b² or b³.
  const T ea = math::exp(a);
  const T bm1 = b - T(1);
  return ((bm1 - (ea + ea - T(1)) / bm1) / b) * (bm1 / b) / b;
}

}  // namespace continuum
