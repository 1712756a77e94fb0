// attention/visibility.hpp — which keys a query sees (SPEC §3), shared by every
// backend and by the references.
#pragma once

#include "params.hpp"

namespace continuum {

/// The contiguous key range [lo, hi) that one query sees; empty when hi ≤ lo
/// (normalised so that hi == lo ≥ 0 then).
struct KeyRange {
  index_t lo = 0, hi = 0;
  CONTINUUM_HOST_DEVICE constexpr bool empty() const { return hi <= lo; }
  CONTINUUM_HOST_DEVICE constexpr index_t size() const { return hi > lo ? hi - lo : 0; }
};

/// Visible key range of query i of batch item b (SPEC §3):
///  * full: [0, Lk);
///  * causal, bottom-right aligned: hi = min(Lk, i + Lk − Lq + 1) (≤ 0: empty);
///  * sliding window W ≥ 1 (0 = none): lo = max(0, hi − W), with hi the causal
///    (or full) upper end;
///  * explicit ranges [B, Lq] (range_lo/range_hi): intersected with the above.
/// The memory curve of the row is built from these keys only (SPEC §2).
CONTINUUM_HOST_DEVICE inline KeyRange visible_range(const Visibility& vis, index_t b, index_t i,
                                                    index_t Lq, index_t Lk) {
  index_t hi = Lk;
  if (vis.causal) {
    const index_t h = i + (Lk - Lq) + 1;
    hi = h < Lk ? h : Lk;
  }
  index_t lo = 0;
  if (vis.window > 0) {
    const index_t l = hi - vis.window;
    lo = l > 0 ? l : 0;
  }
  if (vis.range_lo != nullptr && vis.range_hi != nullptr) {
    const index_t rl = vis.range_lo[b * Lq + i];
    const index_t rh = vis.range_hi[b * Lq + i];
    lo = rl > lo ? rl : lo;
    hi = rh < hi ? rh : hi;
  }
  if (hi < lo) hi = lo;
  return {lo, hi};
}

}  // namespace continuum
