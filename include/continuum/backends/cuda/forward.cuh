// backends/cuda/forward.cuh — the tiled forward kernel (FlashAttention-2
// structure, MATH.md §4–§5 "numerical form of the forward").
//
// One block owns bm query rows of one (batch, query head) and walks the key
// tiles [n0, n0 + bn) that any of its rows can see. Per tile it loads bn + 2 key
// rows (the tile plus the one-column halo on each side that the continuum
// stencil reads: α_j needs s_{j-1} and s_{j+1}, MATH.md §4), forms the bm × (bn+2)
// scores, updates each row's running maximum m (over every visible score it
// has formed, halo included, so that no shifted score is > 0), turns the bn
// interior scores into α_j e^{-m} with the shared Stencil policy of
// math/density.hpp, and accumulates l = Σ α e^{-m} and o = Σ α e^{-m} v in
// fp32 (shared memory), rescaling by e^{m_old - m_new} as the maximum grows.
// Every sum over keys is blocked: a tile's bn terms are summed on their own and
// the tile's sum is added to the running total once, so a row of n keys adds
// rounding of order (bn + n/bn)·u, not n·u (CUDA.md, "Accuracy of long rows").
// At the end o /= l and lse = m + log l; empty rows give o = 0, lse = -inf.
//
// Scores are s = (c q)·k with c = scale/τ folded into q first, so a q·k that
// would overflow fp32 (bug case W13) is not formed when the score is finite.
// Every thread owns fixed elements and sums in a fixed order: the result is
// bitwise reproducible run to run (MATH.md §7.10, bug case W07).
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
/// softmax with the temperature it is given, MATH.md §8).
template <class E, class A, class Stencil>
CONTINUUM_DEVICE void forward_body(const KernelParams<E, A>& p) {
  const int tid = thread_id();
  const int nt = block_threads();
  const int bm = p.bm, bn = p.bn, w = bn + 2;
  const index_t D = p.D, Dv = p.Dv;
  ForwardShared<A> sh;
  ForwardShared<A>::carve(&sh, shared_bytes(), bm, bn, D, Dv);
  const QueryTiles tiles(p);

  for (index_t work = block_id(); work < tiles.count; work += grid_blocks()) {
    const QueryTiles::Item it = tiles.item(work);
    const index_t b = it.b, h = it.h, hk = it.hk, bh = it.bh, i0 = it.i0;

    for (int r = tid; r < bm; r += nt) {
      query_row(p, b, h, i0 + r, sh.lo[r], sh.hi[r], sh.c[r]);
      sh.m[r] = neg_inf<A>();
      sh.l[r] = A(0);
    }
    block_sync();
    load_scaled_query(p, sh.c, sh.q, sh.ldq, b, h, i0, bm);
    for (index_t x = tid; x < bm * Dv; x += nt) sh.o[x] = A(0);
    block_key_range(sh.lo, sh.hi, bm, p.Lk, sh.krange);
    block_sync();
    const index_t kmin = sh.krange[0], kmax = sh.krange[1];

    for (index_t n0 = kmin; n0 < kmax; n0 += bn) {
      // Key rows n0-1 .. n0+bn (halo both sides), value rows n0 .. n0+bn-1.
      load_haloed_rows(p, p.k, sh.k, sh.ldk, b, hk, n0, bn);
      for (index_t x = tid; x < bn * Dv; x += nt) {
        const index_t jj = x / Dv, d = x % Dv, j = n0 + jj;
        sh.v[x] = j < p.Lk ? to_acc(p.v.row(b, hk, j)[d]) : A(0);
      }
      block_sync();
      // Scores of every visible (row, column), halo included; -inf elsewhere.
      tile_scores(sh.q, sh.ldq, sh.k, sh.ldk, D, sh.lo, sh.hi, n0, bm, bn, sh.s);
      block_sync();
      // Running maximum per row.
      for (int r = tid; r < bm; r += nt) {
        const A* sr = sh.s + r * w;
        A mt = neg_inf<A>();
        for (int cc = 0; cc < w; ++cc) mt = math::max(mt, sr[cc]);
        A m = sh.m[r];
        sh.f[r] = detail::raise_row_max(m, mt);  // the shared step (backends/row_state.hpp)
        sh.m[r] = m;
      }
      block_sync();
      // α_j e^{-m} for the interior columns (the shared stencil, MATH.md §4).
      tile_weights<A, Stencil>(sh.s, sh.m, sh.lo, sh.hi, n0, bm, bn, sh.a);
      block_sync();
      for (int r = tid; r < bm; r += nt) {
        A sum = A(0);
        for (int jj = 0; jj < bn; ++jj) sum += sh.a[r * bn + jj];
        sh.l[r] = sh.l[r] * sh.f[r] + sum;
      }
      for (index_t x = tid; x < bm * Dv; x += nt) {
        const index_t r = x / Dv, d = x % Dv;
        const A* ar = sh.a + r * bn;
        A acc = A(0);  // the tile's sum, then one add to the running total
        for (int jj = 0; jj < bn; ++jj) acc += ar[jj] * sh.v[jj * Dv + d];
        sh.o[x] = sh.o[x] * sh.f[r] + acc;
      }
      block_sync();
    }

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
    block_sync();  // the next work item reuses the shared memory
  }
}

}  // namespace cuda_detail
}  // namespace continuum
