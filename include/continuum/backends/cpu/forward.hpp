// backends/cpu/forward.hpp — the CPU forward pass (MATH.md §4–§5): per
// (batch, query head, block of 16 queries), key tiles of 64 with a one-column
// halo on each side, an online row maximum, and accumulation of α̃ and α̃·v in
// double. One implementation for every kernel, templated on the stencil
// policy (ContinuumStencil, SoftmaxStencil).
#pragma once

#include <cmath>
#include <type_traits>

#include "../backend.hpp"
#include "parallel.hpp"
#include "tile.hpp"
#include "isa.hpp"

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

/// Forward for query rows [i0, i0 + nq) of (b, hq). Unscaled (scaled =
/// false) it returns false, writing nothing, when double storage meets a
/// non-finite raw score: the caller reruns it with scaled scores (tile.hpp,
/// W13). Returns true when the outputs are written.
template <class T, class Stencil>
bool forward_block(const ForwardArgs<T>& a, const AttentionShape& sh, double scale, index_t b,
                   index_t hq, index_t qb, bool scaled, Workspace& ws) {
  using F = detail::FlushedStencil<Stencil, double>;
  const index_t Lq = sh.len_q, Lk = sh.len_k, D = sh.dim, Dv = sh.dim_v;
  const index_t hk = hq / sh.group();
  const index_t i0 = qb * block_q;
  const index_t nq = (Lq - i0) < block_q ? (Lq - i0) : block_q;

  KeyRange rg[block_q];
  double c[block_q];
  int ex[block_q] = {};  // score exponents (W13; 0 unless q·k exceeds the double range)
  detail::OnlineRow<double> st[block_q];
  index_t klo = Lk, khi = 0;
  for (index_t r = 0; r < nq; ++r) {
    rg[r] = visible_range(a.visibility, b, i0 + r, Lq, Lk);
    c[r] = scale / temperature_of(a.temperature, b, hq, i0 + r, sh.heads_q, Lq);
    if (!rg[r].empty()) {
      klo = rg[r].lo < klo ? rg[r].lo : klo;
      khi = rg[r].hi > khi ? rg[r].hi : khi;
    }
  }

  // Value exponents (double storage, scaled pass only): a row whose visible
  // values are so large that Σ α̃_j v_j (α̃ ≤ 1 each, up to Lk terms) could
  // overflow sums v_j·2^{−V_r} and scales the result back (exact powers of 2).
  int vx[block_q] = {};
  if constexpr (std::is_same<T, double>::value)
    if (scaled)
      for (index_t r = 0; r < nq; ++r) {
        double vmax = 0.0;
        for (index_t j = rg[r].lo; j < rg[r].hi; ++j) {
          const T* vj = a.value.row(b, hk, j);
          for (index_t e = 0; e < Dv; ++e) vmax = std::fmax(vmax, std::fabs(static_cast<double>(vj[e])));
        }
        const double lim = __DBL_MAX__ / 8.0 / static_cast<double>(rg[r].size() + 2);
        if (vmax > lim && vmax <= __DBL_MAX__) vx[r] = std::ilogb(vmax / lim) + 1;
      }

  Workspace::fit(ws.acc, nq * Dv);
  double* acc = ws.acc.data();
  for (index_t e = 0; e < nq * Dv; ++e) acc[e] = 0.0;

  if (klo < khi) {
    Workspace::fit(ws.qd, nq * D);
    load_rows(a.query, b, hq, i0, nq, ws.qd.data());
    if (scaled) {  // the rows with a non-finite raw score get scaled scores (W13)
      bool bad[block_q];
      nonfinite_score_rows(a.key, b, hk, ws.qd.data(), nq, D, rg, klo, khi, ws, bad);
      for (index_t r = 0; r < nq; ++r)
        if (bad[r])
          ex[r] = scale_query_row(ws.qd.data() + r * D, D, max_abs_finite(a.key, b, hk, rg[r].lo, rg[r].hi));
    }
    const index_t maxc = block_k + 2;
    Workspace::fit(ws.kt, maxc * D);
    Workspace::fit(ws.vd, block_k * Dv);
    Workspace::fit(ws.s, nq * maxc);
    Workspace::fit(ws.w, block_k);
    for (index_t k0 = (klo / block_k) * block_k; k0 < khi; k0 += block_k) {
      const index_t k1 = (k0 + block_k) < khi ? (k0 + block_k) : khi;
      const index_t kv0 = k0 > klo ? k0 : klo;  // first core key loaded
      const index_t c0 = (k0 - 1) > klo ? (k0 - 1) : klo;
      const index_t c1 = (k1 + 1) < khi ? (k1 + 1) : khi;
      const index_t nc = c1 - c0;
      load_rows_transposed(a.key, b, hk, c0, nc, ws.kt.data());
      load_rows(a.value, b, hk, kv0, k1 - kv0, ws.vd.data());
      tile_product(ws.qd.data(), nq, D, ws.kt.data(), nc, ws.s.data());
      for (index_t r = 0; r < nq; ++r) {
        const index_t lo = rg[r].lo, hi = rg[r].hi;
        const index_t ja = k0 > lo ? k0 : lo, jb = k1 < hi ? k1 : hi;
        if (ja >= jb) continue;
        const index_t ca = c0 > lo ? c0 : lo, cb = c1 < hi ? c1 : hi;
        if constexpr (std::is_same<T, double>::value)
          if (!scaled && has_nonfinite(ws.s.data() + r * nc + (ca - c0), cb - ca)) return false;
        double* w = ws.w.data();
        const double f = row_tile_update<Stencil>(ws.s.data() + r * nc, c0, lo, hi, ja, jb, ca, cb,
                                                  c[r], ex[r], st[r], w);
        double* ar = acc + r * Dv;
        if (f != 1.0)
          for (index_t e = 0; e < Dv; ++e) ar[e] *= f;
        for (index_t j = ja; j < jb; ++j)
          if (w[j - ja] != 0.0) {
            const double* vj = ws.vd.data() + (j - kv0) * Dv;
            if (vx[r] == 0) axpy(ar, w[j - ja], vj, Dv);
            else
              for (index_t e = 0; e < Dv; ++e) ar[e] += w[j - ja] * std::ldexp(vj[e], -vx[r]);
          }
      }
    }
  }

  // Double storage: a row whose Σ α̃ v overflowed although it was finite
  // before (values near DBL_MAX) gets the scaled pass (value exponents above).
  if constexpr (std::is_same<T, double>::value)
    if (!scaled)
      for (index_t r = 0; r < nq; ++r)
        if (!rg[r].empty())
          for (index_t e = 0; e < Dv; ++e)
            if (std::isinf(acc[r * Dv + e])) return false;
  // Finalise: O = acc / Σ, lse = c·m + log Σ; empty rows give 0 and -inf.
  const bool inspect = a.probs != nullptr || a.cell_mass != nullptr;
  for (index_t r = 0; r < nq; ++r) {
    const index_t i = i0 + r;
    const index_t row_id = (b * sh.heads_q + hq) * Lq + i;
    T* o = a.out.row(b, hq, i);
    double* ar = acc + r * Dv;
    double lse = -__builtin_huge_val();
    if (!rg[r].empty()) {
      const double sum = st[r].sum;
      if (sum == 0.0) {
        // Every weight underflowed (double storage, score gaps c·Δr beyond
        // ~1e300 around every maximal knot): the τ → 0 limit, the mean of
        // the values at the maximal knots (MATH.md §7.6), and lse ≈ c·m.
        double cnt = 0.0;
        for (index_t e = 0; e < Dv; ++e) ar[e] = 0.0;
        for (index_t j = rg[r].lo; j < rg[r].hi; ++j) {
          if (raw_dot(ws.qd.data() + r * D, a.key.row(b, hk, j), D) != st[r].m) continue;
          const T* vj = a.value.row(b, hk, j);
          for (index_t e = 0; e < Dv; ++e) ar[e] += std::ldexp(static_cast<double>(vj[e]), -vx[r]);
          cnt += 1.0;
        }
        for (index_t e = 0; e < Dv; ++e) ar[e] /= cnt;
        lse = scaled_max(c[r], st[r].m, ex[r]);
      } else {
        for (index_t e = 0; e < Dv; ++e) ar[e] /= sum;
        lse = scaled_max(c[r], st[r].m, ex[r]) + std::log(sum);
      }
    }
    for (index_t e = 0; e < Dv; ++e) o[e] = static_cast<T>(vx[r] ? std::ldexp(ar[e], vx[r]) : ar[e]);
    if (a.lse) a.lse[row_id] = static_cast<T>(lse);

    if (inspect) {
      // Inspection maps P and π ([B, Hq, Lq, Lk]; small inputs): a second
      // sweep over the row with the final maximum and sum.
      T* prow = a.probs ? a.probs + row_id * Lk : nullptr;
      T* mrow = a.cell_mass ? a.cell_mass + row_id * Lk : nullptr;
      const index_t lo = rg[r].lo, hi = rg[r].hi;
      const double sum = st[r].sum, m = st[r].m, cr = c[r];
      const int er = ex[r];
      const double* qi = rg[r].empty() ? nullptr : ws.qd.data() + r * D;  // loaded, scaled row
      auto sc = [&](index_t j) {
        return shifted_score_scaled(cr, raw_dot(qi, a.key.row(b, hk, j), D), m, er);
      };
      for (index_t j = 0; j < Lk; ++j) {
        double p = 0.0, pi = 0.0;
        if (j >= lo && j < hi && sum > 0.0) {
          const bool hl = j - 1 >= lo, hr = j + 1 < hi;
          const double s = sc(j);
          const double l = hl ? sc(j - 1) : 0.0;
          const double rr = hr ? sc(j + 1) : 0.0;
          p = F::weight(l, s, rr, hl, hr) / sum;
          pi = F::cell_mass(l, s, rr, hl, hr) / sum;
        }
        if (prow) prow[j] = static_cast<T>(p);
        if (mrow) mrow[j] = static_cast<T>(pi);
      }
    }
  }
  return true;
}

template <class T, class Stencil>
void forward(const ForwardArgs<T>& a, const AttentionShape& sh, double scale) {
  const index_t nqb = (sh.len_q + block_q - 1) / block_q;
  const index_t items = sh.batch * sh.heads_q * nqb;
  const double work = static_cast<double>(sh.batch * sh.heads_q) * static_cast<double>(sh.len_q) *
                      static_cast<double>(sh.len_k);
  parallel_for<Workspace>(items, a.num_threads, work, [&](index_t item, Workspace& ws) {
    const index_t qb = item % nqb;
    const index_t bh = item / nqb;
    const index_t b = bh / sh.heads_q, hq = bh % sh.heads_q;
    if (!forward_block<T, Stencil>(a, sh, scale, b, hq, qb, false, ws))
      forward_block<T, Stencil>(a, sh, scale, b, hq, qb, true, ws);
  });
}

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
