// detail/row_state.hpp — per-row numerics shared by the CPU and CUDA
// backends: the compute type, shifted scores, the stencil with the underflow
// flush, and the online row maximum (FlashAttention-2's running max, SPEC §5
// "Numerical form of the forward").
//
// Conventions (both backends):
//  * raw scores r_ij = q_i · k_j are formed in compute_t<T> (double for float
//    storage: products of floats are exact in double and |r| ≤ D·FLT_MAX² never
//    overflows, so q = k = [1e19]×4 is fine — CASES.md W13);
//  * the row maximum m_i is kept in raw units, and the stencil sees shifted
//    scores s̃_ij = c_i · (r_ij − m_i) ≤ 0 with c_i = scale / τ_i. Any c_i
//    (tiny τ, W12) then gives s̃ ∈ [−∞, 0]: −∞ is a valid, fully underflowed
//    score, and ∞ − ∞ is never formed;
//  * lse_i = c_i·m_i + log Σ_j α̃_ij, rounded once to the storage type (it may
//    be ±∞ when log Z_i is outside that type's range; the backward does not
//    read it).
#pragma once

#include "../config.hpp"
#include "../math/density.hpp"

namespace continuum {
namespace detail {

/// Type in which scores, stencil weights and accumulators are computed. Both
/// storage types compute in double: for float storage this removes score
/// overflow (W13), keeps every stencil weight of a finite float problem a
/// normal double (no denormals, W11; the smallest nonzero row sum is about
/// 1/(c·Δr) ≥ 1e-122, see flush_threshold) and rounds each output once.
template <class T> struct compute_type { using type = double; };
template <class T> using compute_t = typename compute_type<T>::type;

/// Underflow flush (W11): a key whose three stencil scores (its own and its
/// visible neighbours', shifted by the row maximum) are all below this value
/// gets weight exactly 0 and is skipped, so that no denormal is ever formed
/// (exp(−700) ≈ 9.9e−305 is still normal in double; denormals start below
/// −708.4).
/// Why this cannot change a rounded result: every stencil weight satisfies
/// α̃_j ≤ e^{max(s̃_{j−1}, s̃_j, s̃_{j+1})} (each segment weight is e^{max}
/// times a moment ≤ 1/2), so the dropped mass is at most Lk·e^{−700} ≤
/// 2^{63}·1e−304 ≈ 1e−285. The row sum is at least the maximal knot's weight,
/// ≥ 1/2 if it has a flat half-cell and ≈ 1/δ otherwise, with δ = c·Δr the
/// score gap to its neighbours. For float storage δ ≤ (0.5/1.4e−45)·D·2·
/// FLT_MAX² ≈ 3e122·D, so the relative change is below 1e−160: invisible. For
/// double storage it is invisible unless δ exceeds ~1e260 (documented limit).
template <class C> struct flush_threshold;
template <> struct flush_threshold<double> { static constexpr double value = -700.0; };
template <> struct flush_threshold<float> { static constexpr float value = -87.0f; };

/// Shifted score s̃ = c·(r − m) (≤ 0 when m is the row maximum).
template <class C>
CONTINUUM_HOST_DEVICE inline C shifted_score(C c, C r, C m) {
  return c * (r - m);
}

/// The stencil policy with the flush applied. l, s, r are shifted scores of
/// keys j−1, j, j+1; hl / hr say whether j−1 / j+1 are visible. A NaN score
/// is never flushed (comparisons with NaN are false), so NaN propagates.
template <class Stencil, class C>
struct FlushedStencil {
  CONTINUUM_HOST_DEVICE static bool flushed(C l, C s, C r, bool hl, bool hr) {
    const C t = flush_threshold<C>::value;
    if (!(s < t)) return false;
    if (Stencil::has_halo) {
      if (hl && !(l < t)) return false;
      if (hr && !(r < t)) return false;
    }
    return true;
  }
  /// α̃_j, the unnormalised weight of key j relative to e^{m}.
  CONTINUUM_HOST_DEVICE static C weight(C l, C s, C r, bool hl, bool hr) {
    if (flushed(l, s, r, hl, hr)) return C(0);
    return Stencil::weight(l, s, r, hl, hr);
  }
  /// Unnormalised half-token cell mass of key j (SPEC §5; inspection only).
  CONTINUUM_HOST_DEVICE static C cell_mass(C l, C s, C r, bool hl, bool hr) {
    if (flushed(l, s, r, hl, hr)) return C(0);
    return Stencil::cell_mass(l, s, r, hl, hr);
  }
  /// Z̃·dS_j (SPEC §6): the tridiagonal stencil applied to g_k = dP_k − Dl:
  ///   g_j ∂α_j/∂s_j + g_{j−1} ∂α_{j−1}/∂s_j + g_{j+1} ∂α_{j+1}/∂s_j,
  /// absent terms (invisible neighbours) dropped. Every term is bounded by
  /// e^{max(l, s, r)}, so the flush drops only negligible terms.
  CONTINUUM_HOST_DEVICE static C grad_score(C l, C s, C r, bool hl, bool hr, C gl, C g, C gr) {
    if (flushed(l, s, r, hl, hr)) return C(0);
    C d = g * Stencil::weight_ds(l, s, r, hl, hr);
    if (Stencil::has_halo) {
      if (hl) d += gl * Stencil::coupling(s, l);
      if (hr) d += gr * Stencil::coupling(s, r);
    }
    return d;
  }
};

/// Online row state: running raw maximum m and Σ α̃ relative to e^{c·m}.
template <class C>
struct OnlineRow {
  C m = -__builtin_huge_val();
  C sum = C(0);
  /// Raise the maximum to tile_max (raw units) if larger; returns the factor
  /// by which accumulators relative to the old maximum must be multiplied (1
  /// when unchanged, 0 when nothing was accumulated yet). NaN is ignored here
  /// (it reaches the output through the weights instead).
  CONTINUUM_HOST_DEVICE C raise(C tile_max, C c) {
    if (!(tile_max > m)) return C(1);
    const C f = (m == -__builtin_huge_val()) ? C(0) : math::exp(c * (m - tile_max));
    m = tile_max;
    sum *= f;
    return f;
  }
};

}  // namespace detail
}  // namespace continuum
