// backends/cpu/backward.hpp — the CPU backward pass (MATH.md §6), deterministic
// and without atomics:
//  pass A, per (batch, query head, block of 16 queries): sweep 0 finds each
//    row's raw maximum and reference key ref (first key at the maximum);
//    sweep 1 sums Z̃ = Σ_j α̃_j and Dl − dP_ref = Σ_j P_j (dP_j − dP_ref) and
//    gets Z̃·dS_ref without cancellation (reference_grad_score); in the split
//    scheme sweep 2 then accumulates dQ_i = c_i Σ_j dS_ij k_j and the row's
//    dτ term: the query block owns dQ;
//  pass B, per (batch, KV head, tile of 64 keys): for the query heads that
//    share the KV head (ascending) and every query row that sees a key of the
//    tile (ascending), recompute P and dS and accumulate dV_j = Σ_i P_ij dO_i and
//    dK_j = Σ_i c_i dS_ij q_i: the key tile owns dK and dV. In the fused scheme
//    one item per (batch, KV head) runs all its key tiles and also
//    accumulates dQ, in the same order as sweep 2 (same bits);
//  dτ is reduced serially in a fixed order over what shares τ.
// Memory: O(B·Hq·Lq) row statistics plus per-thread tiles (fused: plus
// O(group·Lq·D) per item); no Lq × Lk matrix.
#pragma once

#include <cmath>
#include <type_traits>
#include <vector>

#include "../backend.hpp"
#include "parallel.hpp"
#include "tile.hpp"
#include "isa.hpp"

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

/// Row statistics saved by pass A for pass B (compute type, [B, Hq, Lq]).
struct RowStats {
  /// m: raw maximum; sum: Σ α̃; dl: Dl − dP_ref; dpref: dP at the row's
  /// reference key ref (first key at the maximum, −1 if none); dsref: Z̃·dS there.
  std::vector<double> m, sum, dl, dpref, dsref, dtau;
  std::vector<index_t> ref;
  /// Score exponent E_i of each row (tile.hpp, W13): m is in units of 2^E_i.
  std::vector<int> ex;
  /// Rows whose every weight underflowed (sum == 0 although keys are visible;
  /// double storage with score gaps c·Δr beyond ~1e300 only): the number of
  /// keys at the raw maximum. The forward returns their mean value (the
  /// τ → 0 limit); the backward gives dV = dO / ties to each of them and no
  /// dQ, dK, dτ contribution from the row (documented limitation).
  std::vector<double> ties;
};

/// Z̃·dS at the reference key of a row (its first key at the raw maximum),
/// in a form without cancellation (see backward_query_block):
///   Z̃·dS_ref = −P_ref·E_far − Σ_{k=ref±1} h_k (α̃_k − ∂α̃_k/∂s_ref)
///              + (1 − P_ref)·Σ_{k=ref±1} h_k α̃_k,
/// with h_k = dP_k − dP_ref, E_far = Σ_{|k−ref|>1} h_k α̃_k, P_ref = α̃_ref/Z̃,
/// 1 − P_ref = Σ_{k≠ref} α̃_k / Z̃. qs is the row's loaded query scaled by
/// 2^{−ex} (raw scores and m in units of 2^ex). The near terms are evaluated here from the
/// scores of keys ref−2 … ref+2: α̃_k − ∂α̃_k/∂s_ref is the weight of k's other
/// side plus ∂w(s_k, s_ref)/∂s_k, a sum of positive terms.
template <class T, class Stencil>
double reference_grad_score(const BackwardArgs<T>& a, const AttentionShape& sh, index_t b, index_t hq,
                            index_t i, KeyRange rg, index_t ref, double c, const double* qs, int ex,
                            double m, double dpref,
                            double alpha_ref, double alpha_other, double sum, double e_far,
                            double e_near) {
  using S = detail::SegmentStencil<Stencil>;
  const double p_ref = alpha_ref / sum, p_other = alpha_other / sum;
  double d = -p_ref * e_far;
  if constexpr (S::has_halo) {
    const index_t hk = hq / sh.group(), D = sh.dim, Dv = sh.dim_v;
    const T* go = a.grad_out.row(b, hq, i);
    auto score = [&](index_t j) {
      return shifted_score_scaled(c, raw_dot(qs, a.key.row(b, hk, j), D), m, ex);
    };
    auto dp = [&](index_t j) { return raw_dot(go, a.value.row(b, hk, j), Dv); };
    const double s_ref = score(ref);
    double near = 0.0;
    for (int side = -1; side <= 1; side += 2) {
      const index_t k = ref + side;
      if (k < rg.lo || k >= rg.hi) continue;
      const double sk = score(k);
      double d_left, d_right, cp, own_dx;
      if (side < 0) {
        S::derivatives(sk, s_ref, &d_left, &d_right, &cp);
        own_dx = d_left;
      } else {
        S::derivatives(s_ref, sk, &d_left, &d_right, &cp);
        own_dx = d_right;
      }
      const index_t o = k + side;  // k's other neighbour
      double other;
      if (o >= rg.lo && o < rg.hi) {
        double wl, wr;
        if (side < 0) {
          S::weights(score(o), sk, &wl, &wr);
          other = wr;
        } else {
          S::weights(sk, score(o), &wl, &wr);
          other = wl;
        }
      } else {
        other = S::half_cell(sk);
      }
      const double h = dp(k) - dpref;
      near += h * (other + own_dx);
    }
    d += -near + p_other * e_near;
  }
  return d;
}

template <class T, class Stencil>
void backward_query_block(const BackwardArgs<T>& a, const AttentionShape& sh, double scale,
                          index_t b, index_t hq, index_t qb, RowStats& rs, bool want_dq,
                          Workspace& ws) {
  const index_t Lq = sh.len_q, Lk = sh.len_k, D = sh.dim, Dv = sh.dim_v;
  const index_t hk = hq / sh.group();
  const index_t i0 = qb * block_q;
  const index_t nq = (Lq - i0) < block_q ? (Lq - i0) : block_q;

  KeyRange rg[block_q];
  index_t ref[block_q];
  int ex[block_q] = {};
  double c[block_q], m[block_q], sum[block_q], dl[block_q], dtau[block_q], dpref[block_q];
  double a_ref[block_q], a_other[block_q], e_far[block_q], e_near[block_q], dsref[block_q];
  index_t klo = Lk, khi = 0;
  for (index_t r = 0; r < nq; ++r) {
    rg[r] = visible_range(a.visibility, b, i0 + r, Lq, Lk);
    c[r] = scale / temperature_of(a.temperature, b, hq, i0 + r, sh.heads_q, Lq);
    ref[r] = -1;
    m[r] = -__builtin_huge_val();
    sum[r] = dtau[r] = dl[r] = dpref[r] = a_ref[r] = a_other[r] = e_far[r] = e_near[r] = dsref[r] = 0.0;
    if (!rg[r].empty()) {
      klo = rg[r].lo < klo ? rg[r].lo : klo;
      khi = rg[r].hi > khi ? rg[r].hi : khi;
    }
  }
  Workspace::fit(ws.dacc, nq * D);
  double* dq = ws.dacc.data();
  for (index_t e = 0; e < nq * D; ++e) dq[e] = 0.0;

  if (klo < khi) {
    Workspace::fit(ws.qd, nq * D);
    Workspace::fit(ws.dod, nq * Dv);
    load_rows(a.query, b, hq, i0, nq, ws.qd.data());
    load_rows(a.grad_out, b, hq, i0, nq, ws.dod.data());
    const index_t maxc = block_k + 2;
    Workspace::fit(ws.kt, maxc * D);
    Workspace::fit(ws.vt, maxc * Dv);
    Workspace::fit(ws.s, nq * maxc);
    Workspace::fit(ws.dp, nq * maxc);
    Workspace::fit(ws.w, block_k);
    Workspace::fit(ws.ds, block_k);
    const index_t kfirst = (klo / block_k) * block_k;
    auto tile_cols = [&](index_t k0, index_t& k1, index_t& c0, index_t& c1) {
      k1 = (k0 + block_k) < khi ? (k0 + block_k) : khi;
      c0 = (k0 - 1) > klo ? (k0 - 1) : klo;
      c1 = (k1 + 1) < khi ? (k1 + 1) : khi;
    };
    // Sweep 0: each row's raw maximum m_i and reference key ref_i (its first
    // visible key at the maximum). Double storage: rows with a non-finite raw
    // score get scaled scores and sweep 0 is redone (tile.hpp, W13; the
    // forward decides the same way, so both use the same E_i).
    bool bad[block_q] = {};
    for (bool scaled = false;; scaled = true) {
      bool redo = false;
      for (index_t k0 = kfirst; k0 < khi; k0 += block_k) {
        index_t k1, c0, c1;
        tile_cols(k0, k1, c0, c1);
        const index_t nc = c1 - c0;
        load_rows_transposed(a.key, b, hk, c0, nc, ws.kt.data());
        tile_product(ws.qd.data(), nq, D, ws.kt.data(), nc, ws.s.data());
        for (index_t r = 0; r < nq; ++r) {
          const index_t ja = k0 > rg[r].lo ? k0 : rg[r].lo, jb = k1 < rg[r].hi ? k1 : rg[r].hi;
          const double* sr = ws.s.data() + r * nc;
          if constexpr (std::is_same<T, double>::value)
            if (!scaled && ja < jb && has_nonfinite(sr + (ja - c0), jb - ja)) redo = bad[r] = true;
          for (index_t j = ja; j < jb; ++j)
            if (sr[j - c0] > m[r]) {
              m[r] = sr[j - c0];
              ref[r] = j;
            }
        }
      }
      if (!redo) break;
      for (index_t r = 0; r < nq; ++r) {
        m[r] = -__builtin_huge_val();
        ref[r] = -1;
        if (bad[r])
          ex[r] = scale_query_row(ws.qd.data() + r * D, D, max_abs_finite(a.key, b, hk, rg[r].lo, rg[r].hi));
      }
    }
    for (index_t r = 0; r < nq; ++r)
      if (ref[r] >= 0) dpref[r] = raw_dot(a.grad_out.row(b, hq, i0 + r), a.value.row(b, hk, ref[r]), Dv);
    // Sweep 1: Z̃ = Σ_j α̃_j (shifted by the final maximum) and, with
    // h_j = dP_j − dP_ref, Dl − dP_ref = Σ_j P_j h_j (MATH.md §6: Dl = Σ_j P_j dP_j
    // = dO·o). Splitting off the reference key removes the cancellation of
    // dP_j − Dl where P is concentrated (tiny τ, W12): the forward's out
    // (rounded to T) is not read, and the sums are kept apart as needed by
    // reference_grad_score.
    for (index_t k0 = kfirst; k0 < khi; k0 += block_k) {
      index_t k1, c0, c1;
      tile_cols(k0, k1, c0, c1);
      const index_t nc = c1 - c0;
      load_rows_transposed(a.key, b, hk, c0, nc, ws.kt.data());
      load_rows_transposed(a.value, b, hk, c0, nc, ws.vt.data());
      tile_product(ws.qd.data(), nq, D, ws.kt.data(), nc, ws.s.data());
      tile_product(ws.dod.data(), nq, Dv, ws.vt.data(), nc, ws.dp.data());
      for (index_t r = 0; r < nq; ++r) {
        const index_t lo = rg[r].lo, hi = rg[r].hi;
        const index_t ja = k0 > lo ? k0 : lo, jb = k1 < hi ? k1 : hi;
        if (ja >= jb) continue;
        const double* sr = ws.s.data() + r * nc;
        const double* pr = ws.dp.data() + r * nc;
        const double mr = m[r], cr = c[r], dpr = dpref[r];
        const int er = ex[r];
        double* w = ws.w.data();
        detail::row_stencil<Stencil>(
            lo, hi, ja, jb, [&](index_t j) { return shifted_score_scaled(cr, sr[j - c0], mr, er); }, w,
            [](index_t) { return 0.0; }, nullptr);
        for (index_t j = ja; j < jb; ++j) {
          const double al = w[j - ja];
          if (al == 0.0) continue;
          sum[r] += al;
          if (j == ref[r]) {
            a_ref[r] += al;
            continue;
          }
          a_other[r] += al;
          const double h = (pr[j - c0] - dpr) * al;
          if (detail::SegmentStencil<Stencil>::has_halo && (j == ref[r] - 1 || j == ref[r] + 1))
            e_near[r] += h;
          else e_far[r] += h;
        }
      }
    }
    for (index_t r = 0; r < nq; ++r) {
      if (rg[r].empty() || sum[r] == 0.0 || ref[r] < 0) continue;
      dl[r] = (e_far[r] + e_near[r]) / sum[r];
      dsref[r] = reference_grad_score<T, Stencil>(a, sh, b, hq, i0 + r, rg[r], ref[r], c[r],
                                                  ws.qd.data() + r * D, ex[r], m[r],
                                                  dpref[r], a_ref[r], a_other[r], sum[r], e_far[r],
                                                  e_near[r]);
    }
    // Sweep 2 (split scheme only): dS, dQ and the dτ terms (shifted scores:
    // Σ_j dS_ij = 0).
    if (want_dq) {
      Workspace::fit(ws.kd, maxc * D);
      for (index_t k0 = kfirst; k0 < khi; k0 += block_k) {
        index_t k1, c0, c1;
        tile_cols(k0, k1, c0, c1);
        const index_t nc = c1 - c0;
        load_rows_transposed(a.key, b, hk, c0, nc, ws.kt.data());
        load_rows(a.key, b, hk, c0, nc, ws.kd.data());
        load_rows_transposed(a.value, b, hk, c0, nc, ws.vt.data());
        tile_product(ws.qd.data(), nq, D, ws.kt.data(), nc, ws.s.data());
        tile_product(ws.dod.data(), nq, Dv, ws.vt.data(), nc, ws.dp.data());
        for (index_t r = 0; r < nq; ++r) {
          const index_t lo = rg[r].lo, hi = rg[r].hi;
          const index_t ja = k0 > lo ? k0 : lo, jb = k1 < hi ? k1 : hi;
          if (ja >= jb || sum[r] == 0.0) continue;
          const double* sr = ws.s.data() + r * nc;
          const double* pr = ws.dp.data() + r * nc;
          const double mr = m[r], cr = c[r], inv = 1.0 / sum[r], dlr = dl[r], dpr = dpref[r];
          const int er = ex[r];
          double* dqr = dq + r * D;
          double* dsr = ws.ds.data();
          detail::row_stencil<Stencil>(
              lo, hi, ja, jb, [&](index_t j) { return shifted_score_scaled(cr, sr[j - c0], mr, er); },
              nullptr, [&](index_t j) { return (pr[j - c0] - dpr) - dlr; }, dsr);
          if (ref[r] >= ja && ref[r] < jb) dsr[ref[r] - ja] = dsref[r];
          for (index_t j = ja; j < jb; ++j) {
            const double ds = dsr[j - ja] * inv;
            if (ds == 0.0) continue;
            axpy(dqr, ds, ws.kd.data() + (j - c0) * D, D);
            const double s = shifted_score_scaled(cr, sr[j - c0], mr, er);
            if (s > -__builtin_huge_val()) dtau[r] += ds * s;
          }
        }
      }
    }
  }

  for (index_t r = 0; r < nq; ++r) {
    const index_t i = i0 + r;
    const index_t row_id = (b * sh.heads_q + hq) * Lq + i;
    const double tau = temperature_of(a.temperature, b, hq, i, sh.heads_q, Lq);
    rs.m[row_id] = m[r];
    rs.sum[row_id] = rg[r].empty() ? 0.0 : sum[r];
    rs.dl[row_id] = dl[r];
    rs.dpref[row_id] = dpref[r];
    rs.ref[row_id] = ref[r];
    rs.dsref[row_id] = dsref[r];
    rs.ex[row_id] = ex[r];
    rs.dtau[row_id] = -dtau[r] / tau;
    if (!rg[r].empty() && sum[r] == 0.0) {
      double n = 0.0;
      for (index_t j = rg[r].lo; j < rg[r].hi; ++j)
        if (raw_dot(ws.qd.data() + r * D, a.key.row(b, hk, j), D) == m[r]) n += 1.0;
      rs.ties[row_id] = n;
    }
    if (a.grad_query.data && want_dq) {
      T* g = a.grad_query.row(b, hq, i);
      const double* dqr = dq + r * D;
      for (index_t e = 0; e < D; ++e) g[e] = static_cast<T>(c[r] * dqr[e]);
    }
  }
}

/// dK, dV of key tile kb of (b, hk). With dq_acc / dtau_acc (the fused
/// scheme: one work item owns all of (b, hk)), it also accumulates Σ_j dS_ij k_j
/// into dq_acc[(g·Lq + i)·D + ·] and Σ_j dS_ij s̃_ij into dtau_acc[g·Lq + i], in
/// exactly the order of backward_query_block's sweep 2 (key tiles ascending,
/// keys ascending), so both schemes give the same bits.
template <class T, class Stencil>
void backward_key_block(const BackwardArgs<T>& a, const AttentionShape& sh, double scale, index_t b,
                        index_t hk, index_t kb, const RowStats& rs, Workspace& ws,
                        double* dq_acc = nullptr, double* dtau_acc = nullptr) {
  const index_t Lq = sh.len_q, Lk = sh.len_k, D = sh.dim, Dv = sh.dim_v;
  const index_t group = sh.group();
  const index_t k0 = kb * block_k;
  const index_t k1 = (k0 + block_k) < Lk ? (k0 + block_k) : Lk;
  const index_t nk = k1 - k0;
  const index_t c0 = k0 > 0 ? k0 - 1 : 0;
  const index_t c1 = (k1 + 1) < Lk ? (k1 + 1) : Lk;
  const index_t nc = c1 - c0;
  const index_t maxc = block_k + 2;

  Workspace::fit(ws.kt, maxc * D);
  Workspace::fit(ws.vt, maxc * Dv);
  Workspace::fit(ws.acc, block_k * Dv);
  Workspace::fit(ws.dacc, block_k * D);
  Workspace::fit(ws.qd, block_q * D);
  Workspace::fit(ws.dod, block_q * Dv);
  Workspace::fit(ws.s, block_q * maxc);
  Workspace::fit(ws.dp, block_q * maxc);
  Workspace::fit(ws.w, block_k);
  Workspace::fit(ws.ds, block_k);
  double* dv = ws.acc.data();
  double* dk = ws.dacc.data();
  for (index_t e = 0; e < nk * Dv; ++e) dv[e] = 0.0;
  for (index_t e = 0; e < nk * D; ++e) dk[e] = 0.0;
  load_rows_transposed(a.key, b, hk, c0, nc, ws.kt.data());
  load_rows_transposed(a.value, b, hk, c0, nc, ws.vt.data());
  if (dq_acc) {
    Workspace::fit(ws.kd, maxc * D);
    load_rows(a.key, b, hk, c0, nc, ws.kd.data());
  }

  const index_t nqb = (Lq + block_q - 1) / block_q;
  for (index_t g = 0; g < group; ++g) {
    const index_t hq = hk * group + g;
    for (index_t qb = 0; qb < nqb; ++qb) {
      const index_t i0 = qb * block_q;
      const index_t nq = (Lq - i0) < block_q ? (Lq - i0) : block_q;
      KeyRange rg[block_q];
      bool any = false;
      for (index_t r = 0; r < nq; ++r) {
        rg[r] = visible_range(a.visibility, b, i0 + r, Lq, Lk);
        const bool meets = !rg[r].empty() && rg[r].lo < k1 && rg[r].hi > k0;
        if (!meets) rg[r] = KeyRange{0, 0};
        any = any || meets;
      }
      if (!any) continue;
      load_rows(a.query, b, hq, i0, nq, ws.qd.data());
      load_rows(a.grad_out, b, hq, i0, nq, ws.dod.data());
      // Scores from q scaled by 2^{−E_i} (rows with E_i ≠ 0, W13); dK from q.
      const double* qscore = ws.qd.data();
      for (index_t r = 0; r < nq; ++r) {
        const int er = rs.ex[static_cast<std::size_t>((b * sh.heads_q + hq) * Lq + i0 + r)];
        if (er == 0 || rg[r].empty()) continue;
        if (qscore == ws.qd.data()) {
          Workspace::fit(ws.qs, nq * D);
          for (index_t e = 0; e < nq * D; ++e) ws.qs[static_cast<std::size_t>(e)] = ws.qd[static_cast<std::size_t>(e)];
          qscore = ws.qs.data();
        }
        for (index_t e = 0; e < D; ++e) ws.qs[static_cast<std::size_t>(r * D + e)] = std::ldexp(ws.qd[static_cast<std::size_t>(r * D + e)], -er);
      }
      tile_product(qscore, nq, D, ws.kt.data(), nc, ws.s.data());
      tile_product(ws.dod.data(), nq, Dv, ws.vt.data(), nc, ws.dp.data());
      for (index_t r = 0; r < nq; ++r) {
        if (rg[r].empty()) continue;
        const index_t i = i0 + r;
        const index_t row_id = (b * sh.heads_q + hq) * Lq + i;
        const double sum = rs.sum[row_id];
        const index_t lo = rg[r].lo, hi = rg[r].hi;
        const index_t ja = k0 > lo ? k0 : lo, jb = k1 < hi ? k1 : hi;
        const double* sr = ws.s.data() + r * nc;
        const double* gr_o = ws.dod.data() + r * Dv;
        if (sum == 0.0) {
          const double ties = rs.ties[row_id];
          for (index_t j = ja; j < jb; ++j)
            if (ties > 0.0 && sr[j - c0] == rs.m[row_id]) axpy(dv + (j - k0) * Dv, 1.0 / ties, gr_o, Dv);
          continue;
        }
        const double m = rs.m[row_id], dlr = rs.dl[row_id], dpr = rs.dpref[row_id], inv = 1.0 / sum;
        const double cr = scale / temperature_of(a.temperature, b, hq, i, sh.heads_q, Lq);
        const int er = rs.ex[row_id];
        const double* pr = ws.dp.data() + r * nc;
        const double* qr = ws.qd.data() + r * D;
        double* wr = ws.w.data();
        double* dsr = ws.ds.data();
        detail::row_stencil<Stencil>(
            lo, hi, ja, jb, [&](index_t j) { return shifted_score_scaled(cr, sr[j - c0], m, er); }, wr,
            [&](index_t j) { return (pr[j - c0] - dpr) - dlr; }, dsr);
        const index_t rf = rs.ref[row_id];
        if (rf >= ja && rf < jb) dsr[rf - ja] = rs.dsref[row_id];
        double* dqr = dq_acc ? dq_acc + (g * Lq + i) * D : nullptr;
        for (index_t j = ja; j < jb; ++j) {
          const double p = wr[j - ja] * inv;
          if (p != 0.0) axpy(dv + (j - k0) * Dv, p, gr_o, Dv);
          const double ds = dsr[j - ja] * inv;
          if (ds == 0.0) continue;
          axpy(dk + (j - k0) * D, cr * ds, qr, D);
          if (dqr) {
            axpy(dqr, ds, ws.kd.data() + (j - c0) * D, D);
            const double s = shifted_score_scaled(cr, sr[j - c0], m, er);
            if (s > -__builtin_huge_val()) dtau_acc[g * Lq + i] += ds * s;
          }
        }
      }
    }
  }
  for (index_t j = 0; j < nk; ++j) {
    if (a.grad_key.data) {
      T* g = a.grad_key.row(b, hk, k0 + j);
      for (index_t e = 0; e < D; ++e) g[e] = static_cast<T>(dk[j * D + e]);
    }
    if (a.grad_value.data) {
      T* g = a.grad_value.row(b, hk, k0 + j);
      for (index_t e = 0; e < Dv; ++e) g[e] = static_cast<T>(dv[j * Dv + e]);
    }
  }
}

template <class T, class Stencil>
void backward(const BackwardArgs<T>& a, const AttentionShape& sh, double scale) {
  const index_t rows = sh.batch * sh.heads_q * sh.len_q;
  RowStats rs;
  rs.m.assign(static_cast<std::size_t>(rows), 0.0);
  rs.sum.assign(static_cast<std::size_t>(rows), 0.0);
  rs.dl.assign(static_cast<std::size_t>(rows), 0.0);
  rs.dpref.assign(static_cast<std::size_t>(rows), 0.0);
  rs.dsref.assign(static_cast<std::size_t>(rows), 0.0);
  rs.ref.assign(static_cast<std::size_t>(rows), -1);
  rs.dtau.assign(static_cast<std::size_t>(rows), 0.0);
  rs.ties.assign(static_cast<std::size_t>(rows), 0.0);
  rs.ex.assign(static_cast<std::size_t>(rows), 0);
  const double work = static_cast<double>(rows) * static_cast<double>(sh.len_k);
  const bool want_dq = a.grad_query.data != nullptr || a.grad_temperature != nullptr;

  const bool want_dkv = a.grad_key.data != nullptr || a.grad_value.data != nullptr;
  // Fused scheme: one work item per (batch, KV head) computes dK, dV and dQ
  // in one sweep (no second pass over the scores for dQ). It needs enough
  // items to keep the threads busy; otherwise pass A also sweeps for dQ and
  // pass B runs per key tile. Both schemes add the same terms in the same
  // order, so the choice (which depends on the thread count) never changes
  // a bit of the result.
  const index_t items_kv = sh.batch * sh.heads_kv;
  const bool fused = want_dq && want_dkv && items_kv >= 2 * effective_threads(a.num_threads, work);

  const index_t nqb = (sh.len_q + block_q - 1) / block_q;
  parallel_for<Workspace>(sh.batch * sh.heads_q * nqb, a.num_threads, work,
                          [&](index_t item, Workspace& ws) {
                            const index_t qb = item % nqb;
                            const index_t bh = item / nqb;
                            backward_query_block<T, Stencil>(a, sh, scale, bh / sh.heads_q,
                                                             bh % sh.heads_q, qb, rs,
                                                             want_dq && !fused, ws);
                          });

  const index_t nkb = (sh.len_k + block_k - 1) / block_k;
  if (fused) {
    const index_t group = sh.group(), Lq = sh.len_q, D = sh.dim;
    parallel_for<Workspace>(items_kv, a.num_threads, work, [&](index_t item, Workspace& ws) {
      const index_t b = item / sh.heads_kv, hk = item % sh.heads_kv;
      std::vector<double> dq(static_cast<std::size_t>(group * Lq * D), 0.0);
      std::vector<double> dtau(static_cast<std::size_t>(group * Lq), 0.0);
      for (index_t kb = 0; kb < nkb; ++kb)
        backward_key_block<T, Stencil>(a, sh, scale, b, hk, kb, rs, ws, dq.data(), dtau.data());
      for (index_t g = 0; g < group; ++g) {
        const index_t hq = hk * group + g;
        for (index_t i = 0; i < Lq; ++i) {
          const index_t row_id = (b * sh.heads_q + hq) * Lq + i;
          const double c = scale / temperature_of(a.temperature, b, hq, i, sh.heads_q, Lq);
          const double tau = temperature_of(a.temperature, b, hq, i, sh.heads_q, Lq);
          rs.dtau[row_id] = -dtau[g * Lq + i] / tau;
          if (a.grad_query.data) {
            T* out = a.grad_query.row(b, hq, i);
            const double* src = dq.data() + (g * Lq + i) * D;
            for (index_t e = 0; e < D; ++e) out[e] = static_cast<T>(c * src[e]);
          }
        }
      }
    });
  } else if (want_dkv) {
    parallel_for<Workspace>(items_kv * nkb, a.num_threads, work, [&](index_t item, Workspace& ws) {
      const index_t kb = item % nkb;
      const index_t bh = item / nkb;
      backward_key_block<T, Stencil>(a, sh, scale, bh / sh.heads_kv, bh % sh.heads_kv, kb, rs, ws);
    });
  }

  // dτ in the temperature's shape, summed in a fixed order (MATH.md §8 shapes, §10 determinism).
  if (a.grad_temperature) {
    switch (a.temperature.shape) {
      case TemperatureShape::per_query:
        for (index_t k = 0; k < rows; ++k) a.grad_temperature[k] = static_cast<T>(rs.dtau[k]);
        break;
      case TemperatureShape::per_head:
        for (index_t h = 0; h < sh.heads_q; ++h) {
          double s = 0.0;
          for (index_t bb = 0; bb < sh.batch; ++bb)
            for (index_t i = 0; i < sh.len_q; ++i) s += rs.dtau[(bb * sh.heads_q + h) * sh.len_q + i];
          a.grad_temperature[h] = static_cast<T>(s);
        }
        break;
      default: {
        double s = 0.0;
        for (index_t k = 0; k < rows; ++k) s += rs.dtau[k];
        a.grad_temperature[0] = static_cast<T>(s);
      }
    }
  }
}

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
