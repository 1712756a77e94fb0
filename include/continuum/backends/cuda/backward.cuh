// backends/cuda/backward.cuh — the deterministic backward (SPEC §6), after
// FlashAttention-2's backward with the elementwise P∘(dP − D) replaced by the
// three-point stencil along the key axis.
//
//   1. delta_body:  D_i = dO_i · o_i                       (one thread per row)
//   2. dq_body:     a block owns bm query rows and walks the key tiles:
//                   dQ_i = c_i Σ_j dS_ij k_j, and the row's dτ_i term
//                   -(1/τ_i) Σ_j dS_ij s_ij
//   3. dkdv_body:   a block owns bn key rows and walks every query tile of
//                   every query head of its GQA group: dV_j = Σ_i P_ij dO_i,
//                   dK_j = Σ_i c_i dS_ij q_i
//   4. dtau_body:   dτ per head / scalar as a fixed-order tree sum of the row terms.
//
// Each output element is written by one thread that sums in a fixed order: no
// atomics, bitwise reproducible (bug case W07). The score tile carries the
// one-column halo on both sides, since dS_ij reads s and dP at j-1, j, j+1.
//
// With t = s - shift and Z = e^{shift}·norm (shift = lse, norm = 1 normally;
// shift = m, norm = l from forward_body<Stats> when |lse| is too large for
// lse to carry log l, see common.cuh lse_trust_limit), the stencil is
// homogeneous: α(t)/norm = α(s)/Z = P and ∂α/∂s(t)/norm = (∂α/∂s)/Z, so
// dα = (dP - D)/Z folds into the shifted derivatives:
//   dS_ij = [(dP_ij - D_i) ∂α_j/∂s_j(t) + (dP_i,j-1 - D_i) κ-coupling(t_{j-1}, t_j)
//           + (dP_i,j+1 - D_i) κ-coupling(t_{j+1}, t_j)] / norm   (absent terms dropped).
#pragma once

#include "common.cuh"

namespace continuum {
namespace cuda_detail {

/// dS (and P) of one visible interior column; `s` points at s_{j-1} of the row
/// in the (bn+2)-wide tile, `dp` at dP_{j-1}.
template <class A, class Stencil>
CONTINUUM_HOST_DEVICE inline A stencil_grad(const A* s, const A* dp, A shift, A inv_norm, A delta,
                                            bool has_left, bool has_right, A* prob) {
  const A tl = s[0] - shift, tc = s[1] - shift, tr = s[2] - shift;
  A ds = (dp[1] - delta) * Stencil::weight_ds(tl, tc, tr, has_left, has_right);
  if (has_left) ds += (dp[0] - delta) * Stencil::coupling(tl, tc);
  if (has_right) ds += (dp[2] - delta) * Stencil::coupling(tr, tc);
  if (prob != nullptr) *prob = Stencil::weight(tl, tc, tr, has_left, has_right) * inv_norm;
  return ds * inv_norm;
}

/// 1. D_i = Σ_d dO_id o_id, for every row of every (batch, query head).
template <class E, class A>
CONTINUUM_DEVICE void delta_body(const KernelParams<E, A>& p) {
  const index_t rows = p.B * p.Hq * p.Lq;
  const index_t stride = grid_blocks() * block_threads();
  for (index_t x = block_id() * block_threads() + thread_id(); x < rows; x += stride) {
    const index_t i = x % p.Lq, bh = x / p.Lq, b = bh / p.Hq, h = bh % p.Hq;
    const E* go = p.dout.row(b, h, i);
    const E* o = p.o.row(b, h, i);
    A acc = A(0);
    for (index_t d = 0; d < p.Dv; ++d) acc += to_acc(go[d]) * to_acc(o[d]);
    p.row_delta[x] = acc;
  }
}

/// Shared memory of the two tile kernels: a bm-row query tile and a
/// (bn+2)-row key tile with their score, dP and dS tiles, and the one
/// accumulator the kernel owns (dQ for dq_body; dK and dV for dkdv_body).
template <class A>
struct BackwardShared {
  index_t *lo, *hi, *krange;
  A *c, *shift, *inv_norm, *delta, *dtau;
  A *q, *go, *k, *v, *s, *dp, *ds, *pr, *acc1, *acc2;
  index_t ldq, ldo, ldk, ldv;

  CONTINUUM_HOST_DEVICE static std::size_t carve(BackwardShared* sh, unsigned char* base, int bm,
                                                 int bn, index_t D, index_t Dv, bool key_owner) {
    BackwardShared t;
    Carve cv{base};
    t.ldq = D + 1;
    t.ldo = Dv + 1;
    t.ldk = D + 1;
    t.ldv = Dv + 1;
    t.lo = cv.take<index_t>(bm);
    t.hi = cv.take<index_t>(bm);
    t.krange = cv.take<index_t>(2);
    t.c = cv.take<A>(bm);
    t.shift = cv.take<A>(bm);
    t.inv_norm = cv.take<A>(bm);
    t.delta = cv.take<A>(bm);
    t.dtau = cv.take<A>(bm);
    t.q = cv.take<A>(bm * t.ldq);
    t.go = cv.take<A>(bm * t.ldo);
    t.k = cv.take<A>((bn + 2) * t.ldk);
    t.v = cv.take<A>((bn + 2) * t.ldv);
    t.s = cv.take<A>(bm * (bn + 2));
    t.dp = cv.take<A>(bm * (bn + 2));
    t.ds = cv.take<A>(bm * bn);
    if (key_owner) {
      t.pr = cv.take<A>(bm * bn);
      t.acc1 = cv.take<A>(bn * D);   // dK
      t.acc2 = cv.take<A>(bn * Dv);  // dV
    } else {
      t.pr = nullptr;
      t.acc1 = cv.take<A>(bm * D);   // dQ
      t.acc2 = nullptr;
    }
    if (sh != nullptr) *sh = t;
    return cv.used;
  }
};

/// Per-row data of query tile [i0, i0+bm) of (b, h): range, c = scale/τ,
/// shift and 1/norm of P, D. Rows past Lq and empty rows get lo == hi.
template <class E, class A>
CONTINUUM_DEVICE void load_row_info(const KernelParams<E, A>& p, const BackwardShared<A>& sh,
                                    index_t b, index_t h, index_t i0, int bm) {
  const index_t bh = b * p.Hq + h;
  for (int r = thread_id(); r < bm; r += block_threads()) {
    const index_t i = i0 + r;
    index_t lo = 0, hi = 0;
    A c = A(0), shift = A(0), norm = A(1), delta = A(0);
    if (i < p.Lq) {
      visible_range(p, b, i, lo, hi);
      c = p.scale / temperature_of(p, b, h, i);
      shift = p.row_shift[bh * p.Lq + i];
      norm = p.row_norm[bh * p.Lq + i];
      delta = p.row_delta[bh * p.Lq + i];
      if (!(shift > neg_inf<A>())) hi = lo;  // forward saw nothing: empty row
    }
    sh.lo[r] = lo;
    sh.hi[r] = hi;
    sh.c[r] = c;
    sh.shift[r] = shift;
    sh.inv_norm[r] = A(1) / norm;
    sh.delta[r] = delta;
    sh.dtau[r] = A(0);
  }
}

/// cQ and dO tiles (after load_row_info and a sync).
template <class E, class A>
CONTINUUM_DEVICE void load_query_tile(const KernelParams<E, A>& p, const BackwardShared<A>& sh,
                                      index_t b, index_t h, index_t i0, int bm) {
  const int tid = thread_id(), nt = block_threads();
  for (index_t x = tid; x < bm * p.D; x += nt) {
    const index_t r = x / p.D, d = x % p.D, i = i0 + r;
    sh.q[r * sh.ldq + d] = i < p.Lq ? sh.c[r] * to_acc(p.q.row(b, h, i)[d]) : A(0);
  }
  for (index_t x = tid; x < bm * p.Dv; x += nt) {
    const index_t r = x / p.Dv, d = x % p.Dv, i = i0 + r;
    sh.go[r * sh.ldo + d] = i < p.Lq ? to_acc(p.dout.row(b, h, i)[d]) : A(0);
  }
}

/// K and V rows n0-1 .. n0+bn of kv head hk (zeros outside [0, Lk)).
template <class E, class A>
CONTINUUM_DEVICE void load_key_tile(const KernelParams<E, A>& p, const BackwardShared<A>& sh,
                                    index_t b, index_t hk, index_t n0, int bn) {
  const int tid = thread_id(), nt = block_threads();
  const index_t w = bn + 2;
  for (index_t x = tid; x < w * p.D; x += nt) {
    const index_t cc = x / p.D, d = x % p.D, j = n0 - 1 + cc;
    sh.k[cc * sh.ldk + d] = (j >= 0 && j < p.Lk) ? to_acc(p.k.row(b, hk, j)[d]) : A(0);
  }
  for (index_t x = tid; x < w * p.Dv; x += nt) {
    const index_t cc = x / p.Dv, d = x % p.Dv, j = n0 - 1 + cc;
    sh.v[cc * sh.ldv + d] = (j >= 0 && j < p.Lk) ? to_acc(p.v.row(b, hk, j)[d]) : A(0);
  }
}

/// s = cq·k and dP = dO·v on the (bn+2)-wide tile (visible entries only), then
/// dS (and P when sh.pr is set) on the bn interior columns. Two syncs inside.
template <class E, class A, class Stencil>
CONTINUUM_DEVICE void score_tile(const KernelParams<E, A>& p, const BackwardShared<A>& sh,
                                 index_t n0, int bm, int bn) {
  const int tid = thread_id(), nt = block_threads();
  const index_t w = bn + 2;
  for (index_t x = tid; x < bm * w; x += nt) {
    const index_t r = x / w, cc = x % w, j = n0 - 1 + cc;
    A s = neg_inf<A>(), dp = A(0);
    if (j >= sh.lo[r] && j < sh.hi[r]) {
      const A* qr = sh.q + r * sh.ldq;
      const A* kr = sh.k + cc * sh.ldk;
      A acc = A(0);
      for (index_t d = 0; d < p.D; ++d) acc += qr[d] * kr[d];
      s = acc;
      const A* gr = sh.go + r * sh.ldo;
      const A* vr = sh.v + cc * sh.ldv;
      acc = A(0);
      for (index_t d = 0; d < p.Dv; ++d) acc += gr[d] * vr[d];
      dp = acc;
    }
    sh.s[x] = s;
    sh.dp[x] = dp;
  }
  block_sync();
  for (index_t x = tid; x < bm * bn; x += nt) {
    const index_t r = x / bn, jj = x % bn, j = n0 + jj;
    const index_t lo = sh.lo[r], hi = sh.hi[r];
    A ds = A(0), prob = A(0);
    if (j >= lo && j < hi) {
      ds = stencil_grad<A, Stencil>(sh.s + r * w + jj, sh.dp + r * w + jj, sh.shift[r], sh.inv_norm[r], sh.delta[r],
                                    j - 1 >= lo, j + 1 < hi, sh.pr != nullptr ? &prob : nullptr);
    }
    sh.ds[x] = ds;
    if (sh.pr != nullptr) sh.pr[x] = prob;
  }
  block_sync();
}

/// 2. dQ and the per-row dτ terms. Work item = (query tile, batch, query head).
template <class E, class A, class Stencil>
CONTINUUM_DEVICE void dq_body(const KernelParams<E, A>& p) {
  const int tid = thread_id(), nt = block_threads();
  const int bm = p.bm, bn = p.bn;
  const index_t D = p.D;
  BackwardShared<A> sh;
  BackwardShared<A>::carve(&sh, shared_bytes(), bm, bn, D, p.Dv, false);
  const index_t n_qtiles = (p.Lq + bm - 1) / bm;
  const index_t n_work = n_qtiles * p.B * p.Hq;
  const index_t group = p.Hq / p.Hk;

  for (index_t work = block_id(); work < n_work; work += grid_blocks()) {
    const index_t qt = work % n_qtiles, bh = work / n_qtiles;
    const index_t b = bh / p.Hq, h = bh % p.Hq, hk = h / group;
    const index_t i0 = qt * bm;
    load_row_info(p, sh, b, h, i0, bm);
    block_sync();
    load_query_tile(p, sh, b, h, i0, bm);
    for (index_t x = tid; x < bm * D; x += nt) sh.acc1[x] = A(0);
    if (tid == 0) {
      index_t kmin = p.Lk, kmax = 0;
      for (int r = 0; r < bm; ++r) {
        if (sh.lo[r] < sh.hi[r]) {
          kmin = math::min(kmin, sh.lo[r]);
          kmax = math::max(kmax, sh.hi[r]);
        }
      }
      sh.krange[0] = kmin;
      sh.krange[1] = kmax;
    }
    block_sync();
    const index_t kmin = sh.krange[0], kmax = sh.krange[1];
    for (index_t n0 = kmin; n0 < kmax; n0 += bn) {
      load_key_tile(p, sh, b, hk, n0, bn);
      block_sync();
      score_tile<E, A, Stencil>(p, sh, n0, bm, bn);
      for (index_t x = tid; x < bm * D; x += nt) {
        const index_t r = x / D, d = x % D;
        const A* dsr = sh.ds + r * bn;
        A acc = sh.acc1[x];
        for (int jj = 0; jj < bn; ++jj) acc += dsr[jj] * sh.k[(jj + 1) * sh.ldk + d];
        sh.acc1[x] = acc;
      }
      if (p.row_dtau != nullptr) {
        for (int r = tid; r < bm; r += nt) {
          const A* dsr = sh.ds + r * bn;
          const A* sr = sh.s + r * (bn + 2) + 1;
          A acc = sh.dtau[r];
          for (int jj = 0; jj < bn; ++jj) {
            if (dsr[jj] != A(0)) acc += dsr[jj] * sr[jj];  // s = -inf where dS = 0 (invisible)
          }
          sh.dtau[r] = acc;
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
        // dτ_i = -(1/τ_i) Σ_j dS_ij s_ij (SPEC §8); 1/τ_i = c_i / scale.
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
  const int tid = thread_id(), nt = block_threads();
  const int bm = p.bm, bn = p.bn;
  const index_t D = p.D, Dv = p.Dv;
  BackwardShared<A> sh;
  BackwardShared<A>::carve(&sh, shared_bytes(), bm, bn, D, Dv, true);
  const index_t n_ktiles = (p.Lk + bn - 1) / bn;
  const index_t n_qtiles = (p.Lq + bm - 1) / bm;
  const index_t n_work = n_ktiles * p.B * p.Hk;
  const index_t group = p.Hq / p.Hk;

  for (index_t work = block_id(); work < n_work; work += grid_blocks()) {
    const index_t kt = work % n_ktiles, bhk = work / n_ktiles;
    const index_t b = bhk / p.Hk, hk = bhk % p.Hk;
    const index_t n0 = kt * bn, n1 = math::min(n0 + bn, p.Lk);
    load_key_tile(p, sh, b, hk, n0, bn);
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
          A acc = sh.acc2[x];
          for (int r = 0; r < bm; ++r) acc += sh.pr[r * bn + jj] * sh.go[r * sh.ldo + d];
          sh.acc2[x] = acc;
        }
        for (index_t x = tid; x < bn * D; x += nt) {
          const index_t jj = x / D, d = x % D;
          A acc = sh.acc1[x];
          for (int r = 0; r < bm; ++r) acc += sh.ds[r * bn + jj] * sh.q[r * sh.ldq + d];
          sh.acc1[x] = acc;
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

/// 4. dτ for a per-head (one block per head) or scalar (one block) temperature:
/// each thread sums a fixed strided subset of the row terms, then a fixed
/// binary tree in shared memory (block_threads() a power of two).
template <class E, class A>
CONTINUUM_DEVICE void dtau_body(const KernelParams<E, A>& p, A* grad_temperature) {
  const int tid = thread_id(), nt = block_threads();
  A* red = reinterpret_cast<A*>(shared_bytes());
  const bool per_head = p.tshape == TemperatureShape::per_head;
  const index_t n_out = per_head ? p.Hq : 1;
  for (index_t out = block_id(); out < n_out; out += grid_blocks()) {
    const index_t n = per_head ? p.B * p.Lq : p.B * p.Hq * p.Lq;
    A acc = A(0);
    for (index_t e = tid; e < n; e += nt) {
      const index_t x = per_head ? ((e / p.Lq) * p.Hq + out) * p.Lq + e % p.Lq : e;
      acc += p.row_dtau[x];
    }
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
