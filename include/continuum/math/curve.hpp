// math/curve.hpp — the memory curve of SPEC §2: one segment between two
// neighbouring visible tokens, and the flat half-token cells at the ends.
//
// Scores passed here are usually already shifted by the row maximum (≤ 0), so
// that every exp() stays ≤ 1; the functions are valid for any finite scores
// and for -∞ (a fully underflowed score), never forming ∞ - ∞.
#pragma once

#include "moments.hpp"

namespace continuum {


/// Segment weight w(x, y) = ∫_0^1 (1-u) e^{(1-u)x + uy} du (SPEC §4): the part
/// of the segment between two neighbouring knots that goes to the knot with
/// score x (the other knot has score y).
/// = e^{max} ν(-|x-y|) if x ≥ y ("near"), e^{max} μ1(-|x-y|) if x < y ("far").
/// Returns 0 when both scores are -∞; NaN in gives NaN out.
template <class T>
CONTINUUM_HOST_DEVICE inline T segment_weight(T x, T y) {
  const T m = math::max(x, y);
  if (m == -__builtin_huge_val()) return T(0);
  const T a = -math::abs(x - y);
  return math::exp(m) * (x >= y ? nu(a) : mu1(a));
}

/// ∂w/∂y(x, y) = ∫_0^1 u(1-u) e^{(1-u)x + uy} du = e^{max} κ(-|x-y|) (SPEC §5).
/// Symmetric in x and y: it is also ∂w(y, x)/∂x's coupling partner, the
/// derivative of the neighbour's weight with respect to this knot's score.
template <class T>
CONTINUUM_HOST_DEVICE inline T segment_weight_dy(T x, T y) {
  const T m = math::max(x, y);
  if (m == -__builtin_huge_val()) return T(0);
  return math::exp(m) * kappa(-math::abs(x - y));
}

/// ∂w/∂x(x, y) = ∫_0^1 (1-u)² e^{(1-u)x + uy} du = e^{max} ν2(-δ) if x ≥ y,
/// e^{max} μ2(-δ) if x < y. SPEC §5 gives it as w - ∂w/∂y; that difference
/// cancels catastrophically in the far case (μ1 - κ = μ2 ≪ μ1), so it is
/// evaluated directly.
template <class T>
CONTINUUM_HOST_DEVICE inline T segment_weight_dx(T x, T y) {
  const T m = math::max(x, y);
  if (m == -__builtin_huge_val()) return T(0);
  const T a = -math::abs(x - y);
  return math::exp(m) * (x >= y ? nu2(a) : mu2(a));
}

/// Flat half-token cell at an end of the visible range (SPEC §2 [choice]):
/// the curve is held at the end knot for half a unit, weight e^x / 2; it is
/// also its own derivative.
template <class T>
CONTINUUM_HOST_DEVICE inline T half_cell_weight(T x) {
  return T(0.5) * math::exp(x);
}

/// Mass of the half of segment (x, y) next to the knot with score x:
/// ∫_0^{1/2} e^{(1-u)x + uy} du = ½ e^{max} μ0(-δ/2) if x ≥ y, and
/// ½ e^{max} e^{-δ/2} μ0(-δ/2) if x < y (SPEC §5, half-token cell masses).
template <class T>
CONTINUUM_HOST_DEVICE inline T half_segment_mass(T x, T y) {
  const T m = math::max(x, y);
  if (m == -__builtin_huge_val()) return T(0);
  const T h = -T(0.5) * math::abs(x - y);
  const T near = T(0.5) * mu0(h);
  return math::exp(m) * (x >= y ? near : math::exp(h) * near);
}

}  // namespace continuum
