// backends/cuda/backward.cuh — the deterministic backward (MATH.md §6), after
// FlashAttention-2's backward with the elementwise P∘(dP − D) replaced by the
// three-point stencil along the key axis.
//
//   1. row_stats_body (the "D pass", run first): a block owns bm query rows
//      and walks their key tiles twice. Sweep 0: each row's maximum score m_i
//      and reference key ref_i (its first key at the maximum), then
//      dP_ref = dO_i·v_ref. Sweep 1: Z̃_i = Σ_j α(s_ij − m_i) and, with
//      h_ij = dP_ij − dP_i,ref, dl_i = Dl_i − dP_i,ref = Σ_j P_ij h_ij; last,
//      dS at the reference key (reference_grad_score).
//   2. dq_body:   a block owns bm query rows and walks the key tiles:
//                 dQ_i = c_i Σ_j dS_ij k_j, and the row's dτ term
//                 -(1/τ_i) Σ_j dS_ij (s_ij − m_i)
//   3. dkdv_body: a block owns bn key rows and walks every query tile of
//                 every query head of its GQA group: dV_j = Σ_i P_ij dO_i,
//                 dK_j = Σ_i c_i dS_ij q_i
//   4. dtau_body: dτ per head / scalar as a fixed-order tree sum of the row terms.
//
// Each output element is written by one thread that sums in a fixed order: no
// atomics, bitwise reproducible (bug case W07). The score tile carries the
// one-column halo on both sides, since dS_ij reads s and dP at j-1, j, j+1.
//
// Dl is not formed as dO_i·o_i (MATH.md §6, "the row term without cancellation"). Where P is concentrated
// (tiny τ, bug case W12) Dl_i ≈ dP_i,ref, so dP_ij − Dl_i cancels to O(τ) at
// the reference key, and the o read back is rounded to the storage type: its
// error ε·|dO||o| swamps dS ~ τ² (W12, float, τ = 1e-3: dQ off by 44 times
// its size). Instead, as the CPU backend does (cpu/tiled.hpp), Dl = Σ_j P_ij
// dP_ij (MATH.md §6) is taken relative to the reference key, so
// neither the forward's o nor its lse is read. With t = s − m (the stencil is
// homogeneous: α(s)/Z = α(t)/Z̃), for j ≠ ref
//   dS_ij = [(h_ij − dl_i) ∂α_j/∂s_j(t) + (h_i,j-1 − dl_i) κ-coupling(t_{j-1}, t_j)
//           + (h_i,j+1 − dl_i) κ-coupling(t_{j+1}, t_j)] / Z̃_i   (absent terms dropped),
// and at j = ref (h_ref = 0), using Σ_k ∂α_k/∂s_j = α_j (the two derivatives
// of a segment weight sum to it; a flat half-cell is its own derivative):
//   Z̃ dS_ref = −P_ref E_far − Σ_{k=ref±1} h_k (α_k − ∂α_k/∂s_ref) + (1 − P_ref) E_near,
// E_near = Σ_{k=ref±1} h_k α_k, E_far = the rest of Σ_k h_k α_k,
// 1 − P_ref = Σ_{k≠ref} α_k / Z̃, and α_k − ∂α_k/∂s_ref = (k's weight from its
// other side) + ∂w/∂x(t_k, 0): every term is formed without cancellation.
#pragma once

#include "common.cuh"

namespace continuum {
namespace cuda_detail {

/// Z̃·dS of one visible interior column j ≠ ref (see the header); `s` points
/// at s_{j-1} of the row in the (bn+2)-wide tile, `h` at h_{j-1}.
template <class A, class Stencil>
CONTINUUM_HOST_DEVICE inline A stencil_grad(const A* s, const A* h, A shift, A dl, bool has_left,
                                            bool has_right) {
  const A tl = s[0] - shift, tc = s[1] - shift, tr = s[2] - shift;
  A ds = (h[1] - dl) * Stencil::weight_ds(tl, tc, tr, has_left, has_right);
  if (has_left) ds += (h[0] - dl) * Stencil::coupling(tl, tc);
  if (has_right) ds += (h[2] - dl) * Stencil::coupling(tr, tc);
  return ds;
}

/// Shared memory of the three tile kernels: per-row data, a bm-row query tile
/// (cQ and dO) and a (bn+2)-row key tile (K and V) with the score and h tiles,
/// and by role: row_stats the α tile; query (dq_body) the dS tile and dQ;
/// key (dkdv_body) the dS and P tiles, dK and dV.
template <class A>
struct BackwardShared {
  enum class Role { row_stats, query, key };
  index_t *lo, *hi, *krange, *ref;
  A *c, *shift, *inv_norm, *dl, *dpref, *dsref, *dtau;  // per row (the row statistics)
  A *sum, *a_ref, *a_other, *e_far, *e_near;           // per row, row_stats_body's sums
  A *q, *go, *k, *v, *s, *h, *ds, *pr, *acc1, *acc2;
  index_t ldq, ldo, ldk, ldv;

  CONTINUUM_HOST_DEVICE static std::size_t carve(BackwardShared* sh, unsigned char* base, int bm,
                                                 int bn, index_t D, index_t Dv, Role role) {
    BackwardShared t;
    Carve cv{base};
    t.ldq = D + 1;
    t.ldo = Dv + 1;
    t.ldk = D + 1;
    t.ldv = Dv + 1;
    t.lo = cv.take<index_t>(bm);
    t.hi = cv.take<index_t>(bm);
    t.krange = cv.take<index_t>(2);
    t.ref = cv.take<index_t>(bm);
    A** rows[] = {&t.c, &t.shift, &t.inv_norm, &t.dl, &t.dpref, &t.dsref, &t.dtau,
                  &t.sum, &t.a_ref, &t.a_other, &t.e_far, &t.e_near};
    const int n_rows = role == Role::row_stats ? 12 : 7;
    for (int x = 0; x < 12; ++x) *rows[x] = x < n_rows ? cv.take<A>(bm) : nullptr;
    t.q = cv.take<A>(bm * t.ldq);
    t.go = cv.take<A>(bm * t.ldo);
    t.k = cv.take<A>((bn + 2) * t.ldk);
    t.v = cv.take<A>((bn + 2) * t.ldv);
    t.s = cv.take<A>(bm * (bn + 2));
    t.h = cv.take<A>(bm * (bn + 2));
    t.ds = role == Role::row_stats ? nullptr : cv.take<A>(bm * bn);
    t.pr = role == Role::query ? nullptr : cv.take<A>(bm * bn);  // row_stats: α(t)
    t.acc1 = role == Role::row_stats ? nullptr
             : role == Role::key     ? cv.take<A>(bn * D)    // dK
                                     : cv.take<A>(bm * D);   // dQ
    t.acc2 = role == Role::key ? cv.take<A>(bn * Dv) : nullptr;  // dV
    if (sh != nullptr) *sh = t;
    return cv.used;
  }
};

/// Visible range and c = scale/τ of the rows of query tile [i0, i0+bm) of
/// (b, h); rows past Lq get lo == hi and c = 0.
template <class E, class A>
CONTINUUM_DEVICE void load_row_range(const KernelParams<E, A>& p, const BackwardShared<A>& sh,
                                     index_t b, index_t h, index_t i0, int bm) {
  for (int r = thread_id(); r < bm; r += block_threads()) query_row(p, b, h, i0 + r, sh.lo[r], sh.hi[r], sh.c[r]);
}

/// load_row_range plus the row statistics of row_stats_body; a row with
/// Z̃ = 0 (empty, or every weight underflowed) gets lo == hi.
template <class E, class A>
CONTINUUM_DEVICE void load_row_info(const KernelParams<E, A>& p, const BackwardShared<A>& sh,
                                    index_t b, index_t h, index_t i0, int bm) {
  load_row_range(p, sh, b, h, i0, bm);
  const index_t bh = b * p.Hq + h;
  for (int r = thread_id(); r < bm; r += block_threads()) {
    const index_t i = i0 + r, x = bh * p.Lq + i;
    const bool row = i < p.Lq;
    const A norm = row ? p.row_norm[x] : A(0);
    if (norm == A(0)) sh.hi[r] = sh.lo[r];
    sh.shift[r] = row ? p.row_shift[x] : A(0);
    sh.inv_norm[r] = norm == A(0) ? A(0) : A(1) / norm;
    sh.ref[r] = row ? p.row_ref[x] : index_t(-1);
    sh.dpref[r] = row ? p.row_dpref[x] : A(0);
    sh.dl[r] = row ? p.row_dl[x] : A(0);
    sh.dsref[r] = row ? p.row_dsref[x] : A(0);
    sh.dtau[r] = A(0);
  }
}

/// cQ and dO tiles (after load_row_range and a sync).
template <class E, class A>
CONTINUUM_DEVICE void load_query_tile(const KernelParams<E, A>& p, const BackwardShared<A>& sh,
                                      index_t b, index_t h, index_t i0, int bm) {
  load_scaled_query(p, sh.c, sh.q, sh.ldq, b, h, i0, bm);
  for (index_t x = thread_id(); x < bm * p.Dv; x += block_threads()) {
    const index_t r = x / p.Dv, d = x % p.Dv, i = i0 + r;
    sh.go[r * sh.ldo + d] = i < p.Lq ? to_acc(p.dout.row(b, h, i)[d]) : A(0);
  }
}

/// h = dP − dP_ref = dO·v − dP_ref on the (bn+2)-wide tile: 0 at the reference
/// key itself (exactly, whatever the rounding of either dot product) and
/// outside the row's range.
template <class E, class A>
CONTINUUM_DEVICE void tile_relative_dp(const KernelParams<E, A>& p, const BackwardShared<A>& sh,
                                       index_t n0, int bm, int bn) {
  const index_t w = bn + 2;
  for (index_t x = thread_id(); x < bm * w; x += block_threads()) {
    const index_t r = x / w, cc = x % w, j = n0 - 1 + cc;
    A h = A(0);
    if (j >= sh.lo[r] && j < sh.hi[r] && j != sh.ref[r]) {
      const A* gr = sh.go + r * sh.ldo;
      const A* vr = sh.v + cc * sh.ldv;
      A acc = A(0);
      for (index_t d = 0; d < p.Dv; ++d) acc += gr[d] * vr[d];
      h = acc - sh.dpref[r];
    }
    sh.h[x] = h;
  }
}

/// Z̃·dS at the reference key of row r of the tile (the form without
/// cancellation in the header), from row_stats_body's sums and, for the
/// near terms, the scores of keys ref-2 … ref+2 and dP at ref±1, recomputed
/// here exactly as the tiles compute them.
template <class E, class A, class Stencil>
CONTINUUM_DEVICE A reference_grad_score(const KernelParams<E, A>& p, const BackwardShared<A>& sh, int r,
                                        index_t b, index_t hk) {
  const A* qr = sh.q + r * sh.ldq;
  const A* gr = sh.go + r * sh.ldo;
  const A m = sh.shift[r];  // = s_ref
  const auto score = [&](index_t j) {  // s_j − s_ref
    const E* kj = p.k.row(b, hk, j);
    A acc = A(0);
    for (index_t x = 0; x < p.D; ++x) acc += qr[x] * to_acc(kj[x]);
    return acc - m;
  };
  const auto dp = [&](index_t j) {
    const E* vj = p.v.row(b, hk, j);
    A acc = A(0);
    for (index_t x = 0; x < p.Dv; ++x) acc += gr[x] * to_acc(vj[x]);
    return acc;
  };
  return detail::reference_grad_score<Stencil, A>(sh.lo[r], sh.hi[r], sh.ref[r], score, dp, sh.dpref[r],
                                                  sh.a_ref[r], sh.a_other[r], sh.sum[r], sh.e_far[r],
                                                  sh.e_near[r]);
}

/// 1. The row statistics (KernelParams' row_*). Work item = (query tile,
/// batch, query head).
template <class E, class A, class Stencil>
CONTINUUM_DEVICE void row_stats_body(const KernelParams<E, A>& p) {
  using Sh = BackwardShared<A>;
  const int tid = thread_id(), nt = block_threads();
  const int bm = p.bm, bn = p.bn, w = bn + 2;
  Sh sh;
  Sh::carve(&sh, shared_bytes(), bm, bn, p.D, p.Dv, Sh::Role::row_stats);
  const QueryTiles tiles(p);

  for (index_t work = block_id(); work < tiles.count; work += grid_blocks()) {
    const QueryTiles::Item it = tiles.item(work);
    const index_t b = it.b, h = it.h, hk = it.hk, bh = it.bh, i0 = it.i0;
    load_row_range(p, sh, b, h, i0, bm);
    for (int r = tid; r < bm; r += nt) {
      sh.ref[r] = -1;
      sh.shift[r] = neg_inf<A>();
      sh.dpref[r] = sh.sum[r] = sh.a_ref[r] = sh.a_other[r] = sh.e_far[r] = sh.e_near[r] = A(0);
    }
    block_sync();
    load_query_tile(p, sh, b, h, i0, bm);
    block_key_range(sh.lo, sh.hi, bm, p.Lk, sh.krange);
    block_sync();
    const index_t kmin = sh.krange[0], kmax = sh.krange[1];

    // Sweep 0: the maximum m_i and the first key ref_i at it (tiles and
    // columns in ascending order, strict >).
    for (index_t n0 = kmin; n0 < kmax; n0 += bn) {
      load_haloed_rows(p, p.k, sh.k, sh.ldk, b, hk, n0, bn);
      block_sync();
      tile_scores(sh.q, sh.ldq, sh.k, sh.ldk, p.D, sh.lo, sh.hi, n0, bm, bn, sh.s);
      block_sync();
      for (int r = tid; r < bm; r += nt) {
        const A* sr = sh.s + r * w + 1;
        for (int jj = 0; jj < bn; ++jj) {
          if (sr[jj] > sh.shift[r]) {  // -inf outside the row's range
            sh.shift[r] = sr[jj];
            sh.ref[r] = n0 + jj;
          }
        }
      }
      block_sync();
    }
    for (int r = tid; r < bm; r += nt) {
      if (sh.ref[r] < 0) continue;
      const E* vr = p.v.row(b, hk, sh.ref[r]);
      const A* gr = sh.go + r * sh.ldo;
      A acc = A(0);
      for (index_t d = 0; d < p.Dv; ++d) acc += gr[d] * to_acc(vr[d]);
      sh.dpref[r] = acc;
    }
    block_sync();

    // Sweep 1: Z̃ = Σ_j α(t_j), split into the reference key and the rest, and
    // E_near / E_far = Σ_j h_j α(t_j) over the reference key's neighbours / the
    // other keys.
    for (index_t n0 = kmin; n0 < kmax; n0 += bn) {
      load_haloed_rows(p, p.k, sh.k, sh.ldk, b, hk, n0, bn);
      load_haloed_rows(p, p.v, sh.v, sh.ldv, b, hk, n0, bn);
      block_sync();
      tile_scores(sh.q, sh.ldq, sh.k, sh.ldk, p.D, sh.lo, sh.hi, n0, bm, bn, sh.s);
      tile_relative_dp(p, sh, n0, bm, bn);
      block_sync();
      tile_weights<A, Stencil>(sh.s, sh.shift, sh.lo, sh.hi, n0, bm, bn, sh.pr);
      block_sync();
      for (int r = tid; r < bm; r += nt) {
        const index_t ref = sh.ref[r];
        // The tile's sums, each added once to the row's running sums (blocked
        // summation: a row of n keys rounds O(bn + n/bn) times, not O(n)).
        A sum = A(0), a_ref = A(0), a_other = A(0), e_near = A(0), e_far = A(0);
        for (int jj = 0; jj < bn; ++jj) {
          const index_t j = n0 + jj;
          const A al = sh.pr[r * bn + jj];
          if (al == A(0)) continue;
          sum += al;
          if (j == ref) {
            a_ref += al;
            continue;
          }
          a_other += al;
          const A e = sh.h[r * w + jj + 1] * al;
          if (Stencil::has_halo && (j == ref - 1 || j == ref + 1))
            e_near += e;
          else
            e_far += e;
        }
        sh.sum[r] += sum;
        sh.a_ref[r] += a_ref;
        sh.a_other[r] += a_other;
        sh.e_near[r] += e_near;
        sh.e_far[r] += e_far;
      }
      block_sync();
    }

    for (int r = tid; r < bm; r += nt) {
      const index_t i = i0 + r;
      if (i >= p.Lq) continue;
      const index_t x = bh * p.Lq + i;
      const A sum = sh.sum[r];
      const bool ok = sh.lo[r] < sh.hi[r] && sum > A(0) && sh.ref[r] >= 0;
      p.row_shift[x] = sh.shift[r];
      p.row_norm[x] = sh.lo[r] < sh.hi[r] ? sum : A(0);
      p.row_ref[x] = sh.ref[r];
      p.row_dpref[x] = sh.dpref[r];
      p.row_dl[x] = ok ? (sh.e_far[r] + sh.e_near[r]) / sum : A(0);
      p.row_dsref[x] = ok ? reference_grad_score<E, A, Stencil>(p, sh, r, b, hk) / sum : A(0);
    }
    block_sync();
  }
}

/// s = cq·k and h = dP − dP_ref on the (bn+2)-wide tile (visible entries
/// only), then dS (and P when sh.pr is set) on the bn interior columns. Two
/// syncs inside.
template <class E, class A, class Stencil>
CONTINUUM_DEVICE void score_tile(const KernelParams<E, A>& p, const BackwardShared<A>& sh,
                                 index_t n0, int bm, int bn) {
  const index_t w = bn + 2;
  tile_scores(sh.q, sh.ldq, sh.k, sh.ldk, p.D, sh.lo, sh.hi, n0, bm, bn, sh.s);
  tile_relative_dp(p, sh, n0, bm, bn);
  block_sync();
  for (index_t x = thread_id(); x < bm * bn; x += block_threads()) {
    const index_t r = x / bn, jj = x % bn, j = n0 + jj;
    const index_t lo = sh.lo[r], hi = sh.hi[r];
    A ds = A(0), prob = A(0);
    if (j >= lo && j < hi) {
      const A* sr = sh.s + r * w + jj;
      const A m = sh.shift[r], inv = sh.inv_norm[r];
      ds = j == sh.ref[r] ? sh.dsref[r]
                          : inv * stencil_grad<A, Stencil>(sr, sh.h + r * w + jj, m, sh.dl[r], j - 1 >= lo,
                                                           j + 1 < hi);
      if (sh.pr != nullptr)
        prob = inv * Stencil::weight(sr[0] - m, sr[1] - m, sr[2] - m, j - 1 >= lo, j + 1 < hi);
    }
    sh.ds[x] = ds;
    if (sh.pr != nullptr) sh.pr[x] = prob;
  }
  block_sync();
}

/// 2. dQ and the per-row dτ terms. Work item = (query tile, batch, query head).
template <class E, class A, class Stencil>
CONTINUUM_DEVICE void dq_body(const KernelParams<E, A>& p) {
  using Sh = BackwardShared<A>;
  const int tid = thread_id(), nt = block_threads();
  const int bm = p.bm, bn = p.bn;
  const index_t D = p.D;
  Sh sh;
  Sh::carve(&sh, shared_bytes(), bm, bn, D, p.Dv, Sh::Role::query);
  const QueryTiles tiles(p);

  for (index_t work = block_id(); work < tiles.count; work += grid_blocks()) {
    const QueryTiles::Item it = tiles.item(work);
    const index_t b = it.b, h = it.h, hk = it.hk, bh = it.bh, i0 = it.i0;
    load_row_info(p, sh, b, h, i0, bm);
    block_sync();
    load_query_tile(p, sh, b, h, i0, bm);
    for (index_t x = tid; x < bm * D; x += nt) sh.acc1[x] = A(0);
    block_key_range(sh.lo, sh.hi, bm, p.Lk, sh.krange);
    block_sync();
    const index_t kmin = sh.krange[0], kmax = sh.krange[1];
    for (index_t n0 = kmin; n0 < kmax; n0 += bn) {
      load_haloed_rows(p, p.k, sh.k, sh.ldk, b, hk, n0, bn);
      load_haloed_rows(p, p.v, sh.v, sh.ldv, b, hk, n0, bn);
      block_sync();
      score_tile<E, A, Stencil>(p, sh, n0, bm, bn);
      for (index_t x = tid; x < bm * D; x += nt) {
        const index_t r = x / D, d = x % D;
        const A* dsr = sh.ds + r * bn;
        A acc = A(0);  // the tile's sum, then one add (blocked, as in row_stats_body)
        for (int jj = 0; jj < bn; ++jj) acc += dsr[jj] * sh.k[(jj + 1) * sh.ldk + d];
        sh.acc1[x] += acc;
      }
      if (p.row_dtau != nullptr) {
        // Σ_j dS_ij (s_ij − m_i) = Σ_j dS_ij s_ij since Σ_j dS_ij = 0; the
        // shifted form keeps |s| ~ 1/τ from multiplying the rounding of that sum.
        for (int r = tid; r < bm; r += nt) {
          const A* dsr = sh.ds + r * bn;
          const A* sr = sh.s + r * (bn + 2) + 1;
          A acc = A(0);
          for (int jj = 0; jj < bn; ++jj) {
            if (dsr[jj] != A(0)) acc += dsr[jj] * (sr[jj] - sh.shift[r]);  // s = -inf where dS = 0 (invisible)
          }
          sh.dtau[r] += acc;
        }
      }
      block_sync();
    }
    if (p.dq.data != nullptr) {
      for (index_t x = tid; x < bm * D; x += nt) {
        const index_t r = x / D, d = x % D, i = i0 + r;
        if (i < p.Lq) p.dq.row(b, h, i)[d] = storage<E>::from(sh.c[r] * sh.acc1[x]);
      }
    }
    if (p.row_dtau != nullptr) {
      for (int r = tid; r < bm; r += nt) {
        const index_t i = i0 + r;
        // dτ_i = -(1/τ_i) Σ_j dS_ij s_ij (MATH.md §6); 1/τ_i = c_i / scale.
        if (i < p.Lq) p.row_dtau[bh * p.Lq + i] = -(sh.c[r] / p.scale) * sh.dtau[r];
      }
    }
    block_sync();
  }
}

/// 3. dK and dV. Work item = (key tile, batch, kv head); loops over the query
/// heads of the GQA group and over the query tiles, in a fixed order.
template <class E, class A, class Stencil>
CONTINUUM_DEVICE void dkdv_body(const KernelParams<E, A>& p) {
  using Sh = BackwardShared<A>;
  const int tid = thread_id(), nt = block_threads();
  const int bm = p.bm, bn = p.bn;
  const index_t D = p.D, Dv = p.Dv;
  Sh sh;
  Sh::carve(&sh, shared_bytes(), bm, bn, D, Dv, Sh::Role::key);
  const index_t n_ktiles = (p.Lk + bn - 1) / bn;
  const index_t n_qtiles = (p.Lq + bm - 1) / bm;
  const index_t n_work = n_ktiles * p.B * p.Hk;
  const index_t group = p.Hq / p.Hk;

  for (index_t work = block_id(); work < n_work; work += grid_blocks()) {
    const index_t kt = work % n_ktiles, bhk = work / n_ktiles;
    const index_t b = bhk / p.Hk, hk = bhk % p.Hk;
    const index_t n0 = kt * bn, n1 = math::min(n0 + bn, p.Lk);
    load_haloed_rows(p, p.k, sh.k, sh.ldk, b, hk, n0, bn);
    load_haloed_rows(p, p.v, sh.v, sh.ldv, b, hk, n0, bn);
    for (index_t x = tid; x < bn * D; x += nt) sh.acc1[x] = A(0);
    for (index_t x = tid; x < bn * Dv; x += nt) sh.acc2[x] = A(0);
    block_sync();
    for (index_t h = hk * group; h < (hk + 1) * group; ++h) {
      for (index_t qt = 0; qt < n_qtiles; ++qt) {
        const index_t i0 = qt * bm;
        load_row_info(p, sh, b, h, i0, bm);
        block_sync();
        if (tid == 0) {  // does any row of this tile see a key of [n0, n1)?
          index_t any = 0;
          for (int r = 0; r < bm; ++r) any |= (sh.lo[r] < n1 && sh.hi[r] > n0 && sh.lo[r] < sh.hi[r]);
          sh.krange[0] = any;
        }
        block_sync();
        if (sh.krange[0] == 0) continue;  // uniform across the block
        load_query_tile(p, sh, b, h, i0, bm);
        block_sync();
        score_tile<E, A, Stencil>(p, sh, n0, bm, bn);
        for (index_t x = tid; x < bn * Dv; x += nt) {
          const index_t jj = x / Dv, d = x % Dv;
          A acc = A(0);  // the query tile's sum, then one add
          for (int r = 0; r < bm; ++r) acc += sh.pr[r * bn + jj] * sh.go[r * sh.ldo + d];
          sh.acc2[x] += acc;
        }
        for (index_t x = tid; x < bn * D; x += nt) {
          const index_t jj = x / D, d = x % D;
          A acc = A(0);
          for (int r = 0; r < bm; ++r) acc += sh.ds[r * bn + jj] * sh.q[r * sh.ldq + d];
          sh.acc1[x] += acc;
        }
        block_sync();
      }
    }
    if (p.dk.data != nullptr) {
      for (index_t x = tid; x < bn * D; x += nt) {
        const index_t jj = x / D, d = x % D, j = n0 + jj;
        if (j < p.Lk) p.dk.row(b, hk, j)[d] = storage<E>::from(sh.acc1[x]);
      }
    }
    if (p.dv.data != nullptr) {
      for (index_t x = tid; x < bn * Dv; x += nt) {
        const index_t jj = x / Dv, d = x % Dv, j = n0 + jj;
        if (j < p.Lk) p.dv.row(b, hk, j)[d] = storage<E>::from(sh.acc2[x]);
      }
    }
    block_sync();
  }
}

/// 4. dτ for a per-head (one block per head) or scalar (one block)
/// temperature, in the order every backend uses (detail::GradTemperatureOrder):
/// thread l is lane l (block_threads() == GradTemperatureOrder::kLanes), then
/// the binary tree in shared memory.
template <class E, class A>
CONTINUUM_DEVICE void dtau_body(const KernelParams<E, A>& p, A* grad_temperature) {
  const int tid = thread_id(), nt = block_threads();
  A* red = reinterpret_cast<A*>(shared_bytes());
  const detail::GradTemperatureOrder order{p.tshape, p.B, p.Hq, p.Lq};
  const index_t n = order.terms();
  for (index_t out = block_id(); out < order.outputs(); out += grid_blocks()) {
    A acc = A(0);
    for (index_t e = tid; e < n; e += nt) acc += p.row_dtau[order.row(out, e)];
    red[tid] = acc;
    block_sync();
    for (int half = nt / 2; half > 0; half /= 2) {
      if (tid < half) red[tid] += red[tid + half];
      block_sync();
    }
    if (tid == 0) grad_temperature[out] = red[0];
    block_sync();
  }
}

}  // namespace cuda_detail
}  // namespace continuum
