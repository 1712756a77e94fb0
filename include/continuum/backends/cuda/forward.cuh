// backends/cuda/forward.cuh — the tiled forward kernel (FlashAttention-2
// structure, SPEC §4–§5 "numerical form of the forward").
//
// One block owns bm query rows of one (batch, query head) and walks the key
// tiles [n0, n0 + bn) that any of its rows can see. Per tile it loads bn + 2 key
// rows (the tile plus the one-column halo on each side that the continuum
// stencil reads: α_j needs s_{j-1} and s_{j+1}, SPEC §4), forms the bm × (bn+2)
// scores, updates each row's running maximum m (over every visible score it
// has formed, halo included, so that no shifted score is > 0), turns the bn
// interior scores into α_j e^{-m} with the shared Stencil policy of
// math/density.hpp, and accumulates l = Σ α e^{-m} and o = Σ α e^{-m} v in
// fp32 (shared memory), rescaling by e^{m_old - m_new} as the maximum grows.
// At the end o /= l and lse = m + log l; empty rows give o = 0, lse = -inf.
//
// Scores are s = (c q)·k with c = scale/τ folded into q first, so a q·k that
// would overflow fp32 (bug case W13) is not formed when the score is finite.
// Every thread owns fixed elements and sums in a fixed order: the result is
// bitwise reproducible run to run (SPEC §7.10, bug case W07).
#pragma once

#include "common.cuh"

namespace continuum {
namespace cuda_detail {

/// Shared memory of the forward kernel (A = accumulator type).
template <class A>
struct ForwardShared {
  index_t *lo, *hi, *krange;       // per-row visible range; the block's [kmin, kmax)
  A *m, *l, *f, *c;                // running max, running sum, rescale, c = scale/τ
  A *q, *k, *v, *s, *a, *o;        // tiles: cQ, K (+halo), V, scores, α, o accumulator
  index_t ldq, ldk;                // padded row strides (D + 1: no bank conflicts)

  /// Carves the tiles out of `base` (nullptr: only counts); returns the bytes used.
  CONTINUUM_HOST_DEVICE static std::size_t carve(ForwardShared* sh, unsigned char* base, int bm,
                                                 int bn, index_t D, index_t Dv) {
    ForwardShared t;
    Carve cv{base};
    t.ldq = D + 1;
    t.ldk = D + 1;
    t.lo = cv.take<index_t>(bm);
    t.hi = cv.take<index_t>(bm);
    t.krange = cv.take<index_t>(2);
    t.m = cv.take<A>(bm);
    t.l = cv.take<A>(bm);
    t.f = cv.take<A>(bm);
    t.c = cv.take<A>(bm);
    t.q = cv.take<A>(bm * t.ldq);
    t.k = cv.take<A>((bn + 2) * t.ldk);
    t.v = cv.take<A>(bn * Dv);
    t.s = cv.take<A>(bm * (bn + 2));
    t.a = cv.take<A>(bm * bn);
    t.o = cv.take<A>(bm * Dv);
    if (sh != nullptr) *sh = t;
    return cv.used;
  }
};

/// Forward kernel body. Stencil = ContinuumStencil or SoftmaxStencil (focal is
/// softmax with the temperature it is given, SPEC §8).
/// Stats = true is the backward's row-statistics pass: no values, no output;
/// for the rows of a work item where |lse| > lse_trust_limit it writes the
/// exact shift m_i and norm l_i (P = α(s − m)/l), elsewhere shift = lse, norm = 1.
template <class E, class A, class Stencil, bool Stats = false>
CONTINUUM_DEVICE void forward_body(const KernelParams<E, A>& p) {
  const int tid = thread_id();
  const int nt = block_threads();
  const int bm = p.bm, bn = p.bn, w = bn + 2;
  const index_t D = p.D, Dv = p.Dv;
  ForwardShared<A> sh;
  ForwardShared<A>::carve(&sh, shared_bytes(), bm, bn, D, Dv);
  const index_t n_qtiles = (p.Lq + bm - 1) / bm;
  const index_t n_work = n_qtiles * p.B * p.Hq;
  const index_t group = p.Hq / p.Hk;

  for (index_t work = block_id(); work < n_work; work += grid_blocks()) {
    const index_t qt = work % n_qtiles, bh = work / n_qtiles;
    const index_t b = bh / p.Hq, h = bh % p.Hq, hk = h / group;
    const index_t i0 = qt * bm;

    for (int r = tid; r < bm; r += nt) {
      const index_t i = i0 + r;
      index_t lo = 0, hi = 0;
      A c = A(0);
      if (i < p.Lq) {
        visible_range(p, b, i, lo, hi);
        c = p.scale / temperature_of(p, b, h, i);
      }
      sh.lo[r] = lo;
      sh.hi[r] = hi;
      sh.c[r] = c;
      sh.m[r] = neg_inf<A>();
      sh.l[r] = A(0);
      if (Stats && i < p.Lq) {
        const A lse = p.lse_in[bh * p.Lq + i];
        p.row_shift[bh * p.Lq + i] = lse;
        p.row_norm[bh * p.Lq + i] = A(1);
        // Trusted rows (and empty rows, lse = -inf) need no recomputation.
        if (!(math::abs(lse) > A(lse_trust_limit)) || !(lse > neg_inf<A>())) sh.hi[r] = sh.lo[r];
      }
    }
    block_sync();
    for (index_t x = tid; x < bm * D; x += nt) {
      const index_t r = x / D, d = x % D, i = i0 + r;
      sh.q[r * sh.ldq + d] = i < p.Lq ? sh.c[r] * to_acc(p.q.row(b, h, i)[d]) : A(0);
    }
    for (index_t x = tid; x < bm * Dv; x += nt) sh.o[x] = A(0);
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
      // Key rows n0-1 .. n0+bn (halo both sides), value rows n0 .. n0+bn-1.
      for (index_t x = tid; x < w * D; x += nt) {
        const index_t cc = x / D, d = x % D, j = n0 - 1 + cc;
        sh.k[cc * sh.ldk + d] = (j >= 0 && j < p.Lk) ? to_acc(p.k.row(b, hk, j)[d]) : A(0);
      }
      if (!Stats) {
        for (index_t x = tid; x < bn * Dv; x += nt) {
          const index_t jj = x / Dv, d = x % Dv, j = n0 + jj;
          sh.v[x] = j < p.Lk ? to_acc(p.v.row(b, hk, j)[d]) : A(0);
        }
      }
      block_sync();
      // Scores of every visible (row, column), halo included; -inf elsewhere.
      for (index_t x = tid; x < bm * w; x += nt) {
        const index_t r = x / w, cc = x % w, j = n0 - 1 + cc;
        A s = neg_inf<A>();
        if (j >= sh.lo[r] && j < sh.hi[r]) {
          const A* qr = sh.q + r * sh.ldq;
          const A* kr = sh.k + cc * sh.ldk;
          A acc = A(0);
          for (index_t d = 0; d < D; ++d) acc += qr[d] * kr[d];
          s = acc;
        }
        sh.s[x] = s;
      }
      block_sync();
      // Running maximum per row.
      for (int r = tid; r < bm; r += nt) {
        const A* sr = sh.s + r * w;
        A mt = neg_inf<A>();
        for (int cc = 0; cc < w; ++cc) mt = math::max(mt, sr[cc]);
        const A m_old = sh.m[r];
        const A m_new = math::max(m_old, mt);
        sh.f[r] = m_new == neg_inf<A>() ? A(1) : math::exp(m_old - m_new);
        sh.m[r] = m_new;
      }
      block_sync();
      // α_j e^{-m} for the interior columns (the shared stencil, SPEC §4).
      for (index_t x = tid; x < bm * bn; x += nt) {
        const index_t r = x / bn, jj = x % bn, j = n0 + jj;
        const index_t lo = sh.lo[r], hi = sh.hi[r];
        A alpha = A(0);
        if (j >= lo && j < hi) {
          const A m = sh.m[r];
          const A* sr = sh.s + r * w + jj;  // sr[0] = s_{j-1}, sr[1] = s_j, sr[2] = s_{j+1}
          alpha = Stencil::weight(sr[0] - m, sr[1] - m, sr[2] - m, j - 1 >= lo, j + 1 < hi);
        }
        sh.a[x] = alpha;
      }
      block_sync();
      for (int r = tid; r < bm; r += nt) {
        A sum = A(0);
        for (int jj = 0; jj < bn; ++jj) sum += sh.a[r * bn + jj];
        sh.l[r] = sh.l[r] * sh.f[r] + sum;
      }
      for (index_t x = tid; x < (Stats ? 0 : bm * Dv); x += nt) {
        const index_t r = x / Dv, d = x % Dv;
        const A* ar = sh.a + r * bn;
        A acc = sh.o[x] * sh.f[r];
        for (int jj = 0; jj < bn; ++jj) acc += ar[jj] * sh.v[jj * Dv + d];
        sh.o[x] = acc;
      }
      block_sync();
    }

    if (Stats) {
      for (int r = tid; r < bm; r += nt) {
        const index_t i = i0 + r;
        if (i < p.Lq && sh.l[r] > A(0)) {
          p.row_shift[bh * p.Lq + i] = sh.m[r];
          p.row_norm[bh * p.Lq + i] = sh.l[r];
        }
      }
    } else {
      for (index_t x = tid; x < bm * Dv; x += nt) {
        const index_t r = x / Dv, d = x % Dv, i = i0 + r;
        if (i < p.Lq) {
          const A l = sh.l[r];
          p.out.row(b, h, i)[d] = storage<E>::from(l > A(0) ? sh.o[x] / l : A(0));
        }
      }
      if (p.lse_out != nullptr) {
        for (int r = tid; r < bm; r += nt) {
          const index_t i = i0 + r;
          if (i < p.Lq) {
            const A l = sh.l[r];
            p.lse_out[bh * p.Lq + i] = l > A(0) ? sh.m[r] + math::log(l) : neg_inf<A>();
          }
        }
      }
    }
    block_sync();  // the next work item reuses the shared memory
  }
}

}  // namespace cuda_detail
}  // namespace continuum
