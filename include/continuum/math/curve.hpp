// math/curve.hpp — the memory curve of MATH.md §2: one segment between two
// neighbouring visible tokens, and the flat half-token cells at the ends.
//
// Scores passed here are usually already shifted by the row maximum (≤ 0), so
// that every exp() stays ≤ 1; the functions are valid for any finite scores
// with e^{max} finite, and for -∞ (a fully underflowed score), never forming
// ∞ - ∞: a segment with a -∞ end has weight, derivatives and masses 0 (the
// curve's exp(score) vanishes on all of it but the finite end point).
// NaN in gives NaN out.
//
// Evaluation: in double for both float and double (float results are rounded
// once, so they are within ~0.5 ulp of the exact value at the float inputs).
// In double the result carries exp()'s error, the moment's (≤ 2 ulp, measured
// ≤ 1.2), one rounding of the product, and the rounding of δ = |x - y|, which
// a moment ~ δ^-k turns into k/2 ulp; tests/unit/test_curve.cpp measures the
// total against MPFR and asserts the budget stated there.
#pragma once

#include "moments.hpp"

namespace continuum {
namespace detail {

inline constexpr double curve_neg_inf = -__builtin_huge_val();

/// The -∞ / NaN prologue shared by the segment functions: true (and *out set)
/// when a NaN must propagate or when the larger score is -∞ (all exp() are 0).
CONTINUUM_HOST_DEVICE inline bool segment_special(double x, double y, double* out) {
  if (x != x || y != y) {
    *out = x + y;  // NaN
    return true;
  }
  if (math::max(x, y) == curve_neg_inf) {
    *out = 0.0;
    return true;
  }
  return false;
}

CONTINUUM_HOST_DEVICE inline double segment_weight(double x, double y) {
  double special;
  if (segment_special(x, y, &special)) return special;
  const double m = math::max(x, y);
  const double a = -math::abs(x - y);
  return math::exp(m) * (x >= y ? nu(a) : mu1(a));
}

CONTINUUM_HOST_DEVICE inline double segment_weight_dy(double x, double y) {
  double special;
  if (segment_special(x, y, &special)) return special;
  const double m = math::max(x, y);
  return math::exp(m) * kappa(-math::abs(x - y));
}

CONTINUUM_HOST_DEVICE inline double segment_weight_dx(double x, double y) {
  double special;
  if (segment_special(x, y, &special)) return special;
  const double m = math::max(x, y);
  const double a = -math::abs(x - y);
  return math::exp(m) * (x >= y ? nu2(a) : mu2(a));
}

CONTINUUM_HOST_DEVICE inline double half_segment_mass(double x, double y) {
  double special;
  if (segment_special(x, y, &special)) return special;
  const double h = -0.5 * math::abs(x - y);
  if (h == curve_neg_inf) return 0.0;  // one end -∞: e^{score} is 0 on the whole half
  const double mass = 0.5 * mu0(h);
  if (x >= y) return math::exp(x) * mass;
  // x < y: e^{max} e^{-δ/2} = e^{(x+y)/2}, one exp of the exactly known midpoint
  // s + ds (two-sum of the halves, no overflow): e^{s+ds} = e^s (1 + ds) + O(ds²).
  const double s = 0.5 * x + 0.5 * y;
  const double bb = s - 0.5 * x;
  const double ds = (0.5 * x - (s - bb)) + (0.5 * y - bb);
  const double e = math::exp(s);
  return math::fma(e, ds, e) * mass;
}

}  // namespace detail

/// Segment weight w(x, y) = ∫_0^1 (1-u) e^{(1-u)x + uy} du (MATH.md §4): the part
/// of the segment between two neighbouring knots that goes to the knot with
/// score x (the other knot has score y).
/// = e^{max} ν(-|x-y|) if x ≥ y ("near"), e^{max} μ1(-|x-y|) if x < y ("far")
/// (MATH.md §5). \tparam T float or double. Returns 0 when either score is -∞ and
/// the other is not +∞; NaN in gives NaN out.
template <class T>
CONTINUUM_HOST_DEVICE inline T segment_weight(T x, T y) {
  return T(detail::segment_weight(double(x), double(y)));
}

/// ∂w/∂y(x, y) = ∫_0^1 u(1-u) e^{(1-u)x + uy} du = e^{max} κ(-|x-y|) (MATH.md §5).
/// Symmetric in x and y: it is also ∂w(y, x)/∂x's coupling partner, the
/// derivative of the neighbour's weight with respect to this knot's score.
template <class T>
CONTINUUM_HOST_DEVICE inline T segment_weight_dy(T x, T y) {
  return T(detail::segment_weight_dy(double(x), double(y)));
}

/// ∂w/∂x(x, y) = ∫_0^1 (1-u)² e^{(1-u)x + uy} du = e^{max} ν2(-δ) if x ≥ y,
/// e^{max} μ2(-δ) if x < y. The shift identity w - ∂w/∂y (MATH.md §5 [choice])
/// cancels in the far case (μ1 - κ = μ2: terms ~1/δ², result ~2/δ³, so about
/// log2(δ/2) bits are lost; test_curve.cpp measures it), so it is evaluated
/// directly.
template <class T>
CONTINUUM_HOST_DEVICE inline T segment_weight_dx(T x, T y) {
  return T(detail::segment_weight_dx(double(x), double(y)));
}

/// Flat half-token cell at an end of the visible range (MATH.md §2 [choice]):
/// the curve is held at the end knot for half a unit, weight e^x / 2; it is
/// also its own derivative and its own cell mass.
template <class T>
CONTINUUM_HOST_DEVICE inline T half_cell_weight(T x) {
  return T(0.5 * math::exp(double(x)));
}

/// Mass of the half of segment (x, y) next to the knot with score x:
/// ∫_0^{1/2} e^{(1-u)x + uy} du = ½ e^{max} μ0(-δ/2) if x ≥ y, and
/// ½ e^{max} e^{-δ/2} μ0(-δ/2) = ½ e^{(x+y)/2} μ0(-δ/2) if x < y (MATH.md §5,
/// half-token cell masses). 0 when either score is -∞; NaN in gives NaN out.
template <class T>
CONTINUUM_HOST_DEVICE inline T half_segment_mass(T x, T y) {
  return T(detail::half_segment_mass(double(x), double(y)));
}

}  // namespace continuum
