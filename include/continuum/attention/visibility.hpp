// attention/visibility.hpp — which keys a query sees (MATH.md §3), shared by every
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

/// Visible key range of query i of batch item b (MATH.md §3):
///  * full: [0, Lk);
///  * causal, bottom-right aligned: hi = min(Lk, i + Lk − Lq + 1) (≤ 0: empty);
///  * sliding window (left, right) around the diagonal key d = i + Lk − Lq
///    (negative = unlimited): lo = max(lo, d − left), hi = min(hi, d + right + 1),
///    computed without overflow for any bound up to INT64_MAX;
///  * explicit ranges [B, Lq] (range_lo/range_hi): intersected with the above.
/// The memory curve of the row is built from these keys only (MATH.md §2).
CONTINUUM_HOST_DEVICE inline KeyRange visible_range(const Visibility& vis, index_t b, index_t i,
                                                    index_t Lq, index_t Lk) {
  // d may be negative (Lq > Lk) but |d| < max(Lq, Lk), so d + 1 and the
  // differences below cannot overflow; the window bounds are only ever
  // compared with them, never added.
  const index_t d = i + (Lk - Lq);
  index_t hi = Lk;
  if (vis.causal) hi = d + 1 < hi ? d + 1 : hi;
  // d + right + 1 < Lk  <=>  right < Lk - 1 - d  (= Lq - 1 - i ≥ 0).
  if (vis.window_right >= 0 && vis.window_right < Lk - 1 - d) {
    const index_t h = d + vis.window_right + 1;
    hi = h < hi ? h : hi;
  }
  index_t lo = 0;
  // d - left > 0  <=>  left < d.
  if (vis.window_left >= 0 && vis.window_left < d) lo = d - vis.window_left;
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
