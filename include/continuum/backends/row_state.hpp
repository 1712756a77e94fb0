// backends/row_state.hpp — per-row numerics shared by the CPU and CUDA
// backends: the underflow flush of the stencil, the stencil evaluated segment
// by segment, the online row maximum (FlashAttention-2's running max, MATH.md
// §5 "Numerical form of the forward"), the score gradient at the reference key
// (MATH.md §6) and the order of dτ's reduction (MATH.md §8, §10).
//
// Conventions (both backends): the stencil sees scores shifted by the row
// maximum m_i, s̃_ij = s_ij − m_i ≤ 0, so −∞ is a valid, fully underflowed
// score and ∞ − ∞ is never formed; lse_i = m_i + log Σ_j α̃_ij is rounded once
// to accum_t<T> (float for 16-bit storage; it may be ±∞ when log Z_i is outside
// that type's range; the backward does not read it).
#pragma once

#include <cstdint>

#include "../attention/params.hpp"
#include "../config.hpp"
#include "../math/density.hpp"

namespace continuum {
namespace detail {

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
  /// Unnormalised half-token cell mass of key j (MATH.md §5; inspection only).
  CONTINUUM_HOST_DEVICE static C cell_mass(C l, C s, C r, bool hl, bool hr) {
    if (flushed(l, s, r, hl, hr)) return C(0);
    return Stencil::cell_mass(l, s, r, hl, hr);
  }
};

/// The stencil evaluated segment by segment (MATH.md §4–§6), for the tiled
/// backends: each segment between two visible neighbours is evaluated once
/// and shared by its two knots, instead of once from each side.
/// Segment t joins knot t (shifted score x) and knot t+1 (score y); with
/// e = e^{max(x,y)}, a = −|x − y| (MATH.md §5):
///   to_left  = w(x, y)          to_right = w(y, x)        (forward weights)
///   d_left   = ∂w(x, y)/∂x      d_right  = ∂w(y, x)/∂y    (own-score derivatives)
///   coupling = ∂w(x, y)/∂y = ∂w(y, x)/∂x = e·κ(a)         (cross derivative)
/// and w = ∂w/∂x + ∂w/∂y (MATH.md §7.7) gives to_left = d_left + coupling,
/// to_right = d_right + coupling: the backward needs three moments (ν2, μ2, κ)
/// and one exp per segment for α, ∂α/∂s and the couplings together.
/// A segment whose larger score is below the flush threshold contributes 0
/// (each of its terms is ≤ e^{max}, see flush_threshold); -∞ scores are
/// handled the same way; NaN gives NaN. A visible key with no visible
/// neighbour on a side has a flat half-cell there: e^{s}/2, its own
/// derivative, no coupling.
template <class Stencil>
struct SegmentStencil;

template <>
struct SegmentStencil<ContinuumStencil> {
  static constexpr bool has_halo = true;
  CONTINUUM_HOST_DEVICE static double half_cell(double s) {
    return s < flush_threshold<double>::value ? 0.0 : 0.5 * math::exp(s);
  }
  CONTINUUM_HOST_DEVICE static void weights(double x, double y, double* to_left, double* to_right) {
    if (x != x || y != y) {
      *to_left = *to_right = x + y;
      return;
    }
    const double m = math::max(x, y);
    if (m < flush_threshold<double>::value) {
      *to_left = *to_right = 0.0;
      return;
    }
    const double e = math::exp(m), a = -math::abs(x - y);
    const double near = e * nu(a), far = e * mu1(a);
    *to_left = x >= y ? near : far;
    *to_right = x >= y ? far : near;
  }
  CONTINUUM_HOST_DEVICE static void derivatives(double x, double y, double* d_left, double* d_right,
                                                double* coupling) {
    if (x != x || y != y) {
      *d_left = *d_right = *coupling = x + y;
      return;
    }
    const double m = math::max(x, y);
    if (m < flush_threshold<double>::value) {
      *d_left = *d_right = *coupling = 0.0;
      return;
    }
    const double e = math::exp(m), a = -math::abs(x - y);
    const double near = e * nu2(a), far = e * mu2(a);
    *d_left = x >= y ? near : far;
    *d_right = x >= y ? far : near;
    *coupling = e * kappa(a);
  }
};

/// Softmax (and focal): α_j = e^{s_j}; no segments.
template <>
struct SegmentStencil<SoftmaxStencil> {
  static constexpr bool has_halo = false;
  CONTINUUM_HOST_DEVICE static double weight(double s) {
    return s < flush_threshold<double>::value ? 0.0 : math::exp(s);
  }
};

/// One step of the online row maximum (FlashAttention-2's running max,
/// MATH.md §5), the same on every backend: raises the row maximum m to
/// tile_max (both in the units the weights are taken in) when that is larger,
/// and returns the factor e^{m_old − m_new} by which everything the row has
/// accumulated relative to e^{m_old} (Σ α e^{−m}, the P·V sums) must be
/// multiplied: 1 when m is unchanged, 0 when nothing was accumulated yet
/// (m = −∞). A NaN tile maximum leaves m as it is (a NaN reaches the output
/// through the weights instead).
template <class C>
CONTINUUM_HOST_DEVICE inline C raise_row_max(C& m, C tile_max) {
  if (!(tile_max > m)) return C(1);
  const C f = m == C(-__builtin_huge_val()) ? C(0) : math::exp(m - tile_max);
  m = tile_max;
  return f;
}

/// Z̃·dS at the reference key `ref` of a row (its first visible key at the
/// maximum) in the form without cancellation (MATH.md §6), the same on every
/// backend:
///   Z̃·dS_ref = −P_ref·E_far − Σ_{k=ref±1} h_k (α̃_k − ∂α̃_k/∂s_ref)
///              + (1 − P_ref)·E_near,
/// with h_k = dP_k − dP_ref, E_far = Σ_{|k−ref|>1} h_k α̃_k, E_near =
/// Σ_{k=ref±1} h_k α̃_k, P_ref = α̃_ref / Z̃ and 1 − P_ref = Σ_{k≠ref} α̃_k / Z̃
/// (the sums come from the caller's sweep over the row). The near terms are
/// evaluated here: score(k) is s_k − s_ref (so s_ref = 0) and dp(k) is dP_k,
/// for the keys ref−2 … ref+2 inside the row's visible range [lo, hi);
/// α̃_k − ∂α̃_k/∂s_ref = (k's weight from its other side) + ∂w(s_k, s_ref)/∂s_k
/// is a sum of positive terms. Softmax has no near terms. W is the type the
/// sums are in; the stencil is evaluated in double.
CONTINUUM_HD_CALLS_ARGUMENTS
template <class Stencil, class W, class Score, class DotP>
CONTINUUM_HOST_DEVICE inline W reference_grad_score(index_t lo, index_t hi, index_t ref, Score score, DotP dp,
                                                    W dpref, W alpha_ref, W alpha_other, W sum, W e_far,
                                                    W e_near) {
  using S = SegmentStencil<Stencil>;
  const W p_ref = alpha_ref / sum, p_other = alpha_other / sum;
  W d = -p_ref * e_far;
  if constexpr (S::has_halo) {
    W near = W(0);
    for (int side = -1; side <= 1; side += 2) {
      const index_t k = ref + side;
      if (k < lo || k >= hi) continue;
      const double sk = double(score(k));
      double d_left, d_right, cp, own_dx;
      if (side < 0) {
        S::derivatives(sk, 0.0, &d_left, &d_right, &cp);
        own_dx = d_left;
      } else {
        S::derivatives(0.0, sk, &d_left, &d_right, &cp);
        own_dx = d_right;
      }
      const index_t o = k + side;  // k's other neighbour
      double other;
      if (o >= lo && o < hi) {
        double wl, wr;
        if (side < 0) {
          S::weights(double(score(o)), sk, &wl, &wr);
          other = wr;
        } else {
          S::weights(sk, double(score(o)), &wl, &wr);
          other = wl;
        }
      } else {
        other = S::half_cell(sk);
      }
      const W h = dp(k) - dpref;
      near += h * W(other + own_dx);
    }
    d += -near + p_other * e_near;
  }
  return d;
}

/// The fixed order of dτ's reduction (MATH.md §8, §10), the same on every
/// backend. A per-head temperature has one output per query head, a scalar
/// one; a per-query temperature needs no reduction. Output `out` sums the
/// per-row terms −(1/τ_i) Σ_j dS_ij s̃_ij of the rows row(out, e), e = 0 …
/// terms() − 1 (batch-major, then query), over kLanes lanes: term e goes into
/// lane e mod kLanes in ascending e, then the lanes are added by a binary
/// tree (lane l += lane l + half for half = kLanes/2 … 1). The CUDA kernel
/// runs one lane per thread (a block of kLanes threads), the CPU the lanes in
/// turn (fixed_order_sum).
struct GradTemperatureOrder {
  static constexpr int kLanes = 256;
  TemperatureShape shape;
  index_t batch, heads, seq;
  CONTINUUM_HOST_DEVICE index_t outputs() const { return shape == TemperatureShape::per_head ? heads : 1; }
  CONTINUUM_HOST_DEVICE index_t terms() const {
    return shape == TemperatureShape::per_head ? batch * seq : batch * heads * seq;
  }
  /// Row id (b·heads + h)·seq + i of term e of output out.
  CONTINUUM_HOST_DEVICE index_t row(index_t out, index_t e) const {
    return shape == TemperatureShape::per_head ? ((e / seq) * heads + out) * seq + e % seq : e;
  }
};

/// Output `out` of that order on the host: term(row) summed in A.
template <class A, class Term>
inline A fixed_order_sum(const GradTemperatureOrder& order, index_t out, Term term) {
  constexpr int L = GradTemperatureOrder::kLanes;
  A lane[L] = {};
  const index_t n = order.terms();
  for (index_t e = 0; e < n; ++e) lane[e % L] += term(order.row(out, e));
  for (int half = L / 2; half > 0; half /= 2)
    for (int l = 0; l < half; ++l) lane[l] += lane[l + half];
  return lane[0];
}

}  // namespace detail
}  // namespace continuum
