// math/density.hpp — the relevance density's three-point stencil (MATH.md §4, §6)
// and the score-to-weight policies that make continuum, softmax and focal
// attention one operator.
//
// For query i and visible key j (range [lo, hi)), with scores s_{j-1}, s_j, s_{j+1}:
//   α_j = L_j + R_j,  L_j = w(s_j, s_{j-1}) if j-1 ≥ lo else e^{s_j}/2,
//                      R_j = w(s_j, s_{j+1}) if j+1 < hi else e^{s_j}/2.
// Softmax replaces the stencil by α_j = e^{s_j}. Scores are shifted by the row
// maximum by the callers; the stencil is invariant to the shift up to e^{shift}.
#pragma once

#include "curve.hpp"

namespace continuum {

/// Which attention operator: a runtime choice for the API; the kernels are
/// templated on the matching stencil policy below.
/// `focal` is softmax whose temperature is set by the model (MATH.md §8): at the
/// operator level it uses the softmax stencil with the temperature it is given.
enum class Kernel { continuum, softmax, focal };

inline constexpr const char* kernel_name(Kernel k) {
  return k == Kernel::continuum ? "continuum" : k == Kernel::softmax ? "softmax" : "focal";
}

/// Continuum stencil policy (MATH.md §4, §6): α depends on the two neighbours.
/// Scores may be -∞ (then that side's segment contributes 0, see curve.hpp);
/// a side whose neighbour is not visible is a flat half-token cell (MATH.md §2).
/// Each function is evaluated in double and rounded once to T.
struct ContinuumStencil {
  static constexpr bool has_halo = true;

  /// α_j = L_j + R_j from the (shifted) scores (MATH.md §4); has_left / has_right
  /// say whether the neighbour is visible (else that side is a flat half-cell).
  /// Equal scores give α_j = e^s (½ e^s from each side), as softmax does.
  template <class T>
  CONTINUUM_HOST_DEVICE static T weight(T left, T s, T right, bool has_left, bool has_right) {
    const double x = double(s);
    const double l = has_left ? detail::segment_weight(x, double(left)) : 0.5 * math::exp(x);
    const double r = has_right ? detail::segment_weight(x, double(right)) : 0.5 * math::exp(x);
    return T(l + r);
  }
  /// ∂α_j/∂s_j = ∂w/∂x(s_j, s_{j-1}) + ∂w/∂x(s_j, s_{j+1}) (MATH.md §6); a flat
  /// half-cell contributes e^{s_j}/2.
  template <class T>
  CONTINUUM_HOST_DEVICE static T weight_ds(T left, T s, T right, bool has_left, bool has_right) {
    const double x = double(s);
    const double l = has_left ? detail::segment_weight_dx(x, double(left)) : 0.5 * math::exp(x);
    const double r = has_right ? detail::segment_weight_dx(x, double(right)) : 0.5 * math::exp(x);
    return T(l + r);
  }
  /// ∂α_j/∂s_{j±1} = ∂α_{j±1}/∂s_j = ∂w/∂y(s_j, s_{j±1}): the coupling across the
  /// segment (s_j, s_{j±1}) (MATH.md §6); symmetric in its two arguments. Only for
  /// visible neighbours (a flat half-cell has no coupling).
  template <class T>
  CONTINUUM_HOST_DEVICE static T coupling(T s, T neighbour) {
    return segment_weight_dy(s, neighbour);
  }
  /// Cell mass (unnormalised) π_j: the density e^{s(t)} integrated over token j's
  /// cell [j - 1/2, j + 1/2] (MATH.md §5). Σ_j π_j = Σ_j α_j = Z over a row.
  template <class T>
  CONTINUUM_HOST_DEVICE static T cell_mass(T left, T s, T right, bool has_left, bool has_right) {
    const double x = double(s);
    const double l = has_left ? detail::half_segment_mass(x, double(left)) : 0.5 * math::exp(x);
    const double r = has_right ? detail::half_segment_mass(x, double(right)) : 0.5 * math::exp(x);
    return T(l + r);
  }
};

/// Softmax stencil policy (MATH.md §8, softmax and focal): α_j = e^{s_j}; no
/// neighbours, no coupling.
struct SoftmaxStencil {
  static constexpr bool has_halo = false;
  template <class T>
  CONTINUUM_HOST_DEVICE static T weight(T, T s, T, bool, bool) { return math::exp(s); }
  template <class T>
  CONTINUUM_HOST_DEVICE static T weight_ds(T, T s, T, bool, bool) { return math::exp(s); }
  template <class T>
  CONTINUUM_HOST_DEVICE static T coupling(T, T) { return T(0); }
  template <class T>
  CONTINUUM_HOST_DEVICE static T cell_mass(T, T s, T, bool, bool) { return math::exp(s); }
};

}  // namespace continuum
