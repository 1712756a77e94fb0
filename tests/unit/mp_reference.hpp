// tests/unit/mp_reference.hpp — multiprecision (MPFR via mpreal) references for
// the exponential moments of MATH.md §5 and the ulp-error measure used by the
// primitive tests. Not a test file itself (only *.cpp become executables).
#pragma once

#include <mpreal.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace mpref {

using mpfr::mpreal;

/// Working precision of the references. The closed forms below lose at most
/// ~3·40 + 4 bits to cancellation (|a| ≥ 2^-40, see mp_moments), leaving
/// ≥ 270 correct bits: far more than the ≥ 200 the tests need.
inline constexpr int kPrec = 400;

/// All six moments of MATH.md §5 (plus μ2, ν2) at one argument a ≤ 0, exact input.
struct Moments {
  mpreal mu0, mu1, mu2, nu, kappa, nu2;
};

/// Closed forms (a ≠ 0):
///   μ0 = expm1(a)/a,  μ1 = (a e^a - expm1 a)/a²,  μ2 = (e^a (a² - 2a + 2) - 2)/a³,
///   ν = (expm1 a - a)/a²,  κ = ((a-2) e^a + a + 2)/a³,  ν2 = (2 e^a - a² - 2a - 2)/a³;
/// for |a| < 2^-40 the power series Σ a^m c_m / m! with 12 terms (|a|^12 < 2^-480):
///   μ0: 1/(m+1)   μ1: 1/(m+2)   μ2: 1/(m+3)   ν: 1/((m+1)(m+2))
///   κ: 1/((m+2)(m+3))   ν2: 2/((m+1)(m+2)(m+3)).
/// a = -∞ gives 0 for all; a = 0 gives 1, 1/2, 1/3, 1/2, 1/6, 1/3.
inline Moments mp_moments(const mpreal& a_in) {
  mpreal a(a_in); a.set_prec(kPrec);  // exact: kPrec ≥ the input's precision
  Moments r;
  if (mpfr::isinf(a)) {
    r.mu0 = r.mu1 = r.mu2 = r.nu = r.kappa = r.nu2 = mpreal(0, kPrec);
    return r;
  }
  if (mpfr::abs(a) < mpfr::ldexp(mpreal(1, kPrec), -40)) {
    mpreal s[6];
    for (auto& x : s) x = mpreal(0, kPrec);
    mpreal p(1, kPrec);  // a^m / m!
    for (int m = 0; m < 12; ++m) {
      if (m > 0) p = p * a / m;
      const double m1 = m + 1, m2 = m + 2, m3 = m + 3;
      s[0] += p / m1;
      s[1] += p / m2;
      s[2] += p / m3;
      s[3] += p / (m1 * m2);
      s[4] += p / (m2 * m3);
      s[5] += 2 * p / (m1 * m2 * m3);
    }
    r.mu0 = s[0]; r.mu1 = s[1]; r.mu2 = s[2]; r.nu = s[3]; r.kappa = s[4]; r.nu2 = s[5];
    return r;
  }
  const mpreal e = mpfr::exp(a);
  const mpreal em1 = mpfr::expm1(a);
  const mpreal a2 = a * a, a3 = a2 * a;
  r.mu0 = em1 / a;
  r.mu1 = (a * e - em1) / a2;
  r.mu2 = (e * (a2 - 2 * a + 2) - 2) / a3;
  r.nu = (em1 - a) / a2;
  r.kappa = ((a - 2) * e + a + 2) / a3;
  r.nu2 = (2 * e - a2 - 2 * a - 2) / a3;
  return r;
}

/// Error of `got` against the exact value `ref`, in units in the last place of
/// T at ref (the spacing of T's values in ref's binade; 2^(emin - p + 1) for
/// subnormals). NaN vs NaN and equal infinities count 0; otherwise a NaN or an
/// infinity on one side counts +∞.
template <class T>
double ulp_error(T got, const mpreal& ref) {
  using L = std::numeric_limits<T>;
  const bool gn = std::isnan(got), rn = mpfr::isnan(ref);
  if (gn || rn) return gn && rn ? 0.0 : HUGE_VAL;
  if (std::isinf(got) || mpfr::isinf(ref)) {
    return (std::isinf(got) && mpfr::isinf(ref) && (got > 0) == (ref > 0)) ? 0.0 : HUGE_VAL;
  }
  // ref = m·2^e with m in [1/2, 1): its binade is [2^(e-1), 2^e).
  long e = ref == 0 ? (L::min_exponent - 1) : (long(ref.get_exp()) - 1);
  if (e < L::min_exponent - 1) e = L::min_exponent - 1;
  const mpreal ulp = mpfr::ldexp(mpreal(1, kPrec), int(e - (L::digits - 1)));
  const mpreal diff = mpfr::abs(mpreal(got, kPrec) - ref);
  return (diff / ulp).toDouble();
}

/// n-point Gauss–Legendre rule on [0, 1] at kPrec bits (Newton on P_n).
/// Exact for polynomials of degree < 2n; for e^{-δu}·(polynomial of degree
/// ≤ 2) with δ ≤ 30 and n = 48 the error is below 1e-35 relative.
struct GaussLegendre {
  std::vector<mpreal> x, w;
  explicit GaussLegendre(int n) {
    const mpreal pi = mpfr::const_pi(kPrec);
    for (int i = 0; i < n; ++i) {
      mpreal t = mpfr::cos(pi * (i + 0.75) / (n + 0.5));
      mpreal dp;
      for (int it = 0; it < 100; ++it) {
        mpreal p0(1, kPrec), p1 = t;
        for (int k = 2; k <= n; ++k) {
          mpreal p2 = ((2 * k - 1) * t * p1 - (k - 1) * p0) / k;
          p0 = p1;
          p1 = p2;
        }
        dp = n * (t * p1 - p0) / (t * t - 1);
        const mpreal dt = p1 / dp;
        t -= dt;
        if (mpfr::abs(dt) < mpfr::ldexp(mpreal(1, kPrec), -kPrec + 8)) break;
      }
      x.push_back((1 - t) / 2);
      w.push_back(1 / ((1 - t * t) * dp * dp));  // (2/((1-t²)P'²)) · 1/2 for [0, 1]
    }
  }
  /// ∫_0^L f(u) du.
  template <class F>
  mpreal integrate(F f, const mpreal& L = mpreal(1, kPrec)) const {
    mpreal s(0, kPrec);
    for (size_t i = 0; i < x.size(); ++i) s += w[i] * f(L * x[i]);
    return s * L;
  }
};

/// Exact segment quantities of MATH.md §4–§5 at exact scores x, y (closed forms at
/// kPrec bits via mp_moments): weight w(x,y), ∂w/∂x, ∂w/∂y, and the mass of the
/// half next to x. -∞ scores give 0 (the curve's exp vanishes on the segment).
struct Segment {
  mpreal w, dx, dy, half;
};
inline Segment mp_segment(const mpreal& x_in, const mpreal& y_in) {
  mpreal x(x_in), y(y_in);
  x.set_prec(kPrec);
  y.set_prec(kPrec);
  Segment s;
  if (mpfr::isinf(x) || mpfr::isinf(y)) {
    s.w = s.dx = s.dy = s.half = mpreal(0, kPrec);
    return s;
  }
  const bool near = x >= y;
  const mpreal m = near ? x : y;
  const mpreal d = mpfr::abs(x - y);
  const mpreal em = mpfr::exp(m);
  const Moments f = mp_moments(-d);
  const Moments g = mp_moments(-d / 2);
  s.w = em * (near ? f.nu : f.mu1);
  s.dx = em * (near ? f.nu2 : f.mu2);
  s.dy = em * f.kappa;
  s.half = em * g.mu0 / 2 * (near ? mpreal(1, kPrec) : mpfr::exp(-d / 2));
  return s;
}

/// "-0x1.8p+3 (-12)": an input that reproduces exactly, plus a readable value.
template <class T>
std::string show(T x) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%a (%.9g)", double(x), double(x));
  return buf;
}

}  // namespace mpref
