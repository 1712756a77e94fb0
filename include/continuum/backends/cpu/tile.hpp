// backends/cpu/tile.hpp — tiles of the CPU backend: block sizes, per-thread
// workspace, loading strided views into compute-type tiles, the score tile
// product and the per-row online update over one key tile (shared by the
// forward and the backward so that both see bit-identical row statistics).
#pragma once

#include <vector>

#include "../../attention/params.hpp"
#include "../../attention/validate.hpp"
#include "../../attention/visibility.hpp"
#include "../../detail/row_state.hpp"

#if defined(_OPENMP)
#  define CONTINUUM_PRAGMA_SIMD _Pragma("omp simd")
#else
#  define CONTINUUM_PRAGMA_SIMD
#endif

namespace continuum {
namespace cpu_detail {

/// Query rows per block and keys per tile. Key tiles are aligned to multiples
/// of block_k globally, so a row meets the same tiles in the same order
/// whatever block it belongs to: a KV-cache decode row (Lq = 1) is computed
/// bit for bit like the same row of the full causal forward (SPEC §7.9).
inline constexpr index_t block_q = 16;
inline constexpr index_t block_k = 64;

/// Per-thread scratch (O(tile) memory; nothing of size Lq × Lk).
struct Workspace {
  std::vector<double> qd, dod, kt, kd, vd, vt, s, dp, acc, dacc, w, ds;
  static void fit(std::vector<double>& v, index_t n) {
    if (static_cast<index_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
  }
};

/// Temperature of query row (b, hq, i) as a double.
template <class T>
inline double temperature_of(const Temperature<T>& t, index_t b, index_t hq, index_t i, index_t Hq,
                             index_t Lq) {
  switch (t.shape) {
    case TemperatureShape::per_head: return static_cast<double>(t.data[hq]);
    case TemperatureShape::per_query: return static_cast<double>(t.data[(b * Hq + hq) * Lq + i]);
    default: return static_cast<double>(t.value);
  }
}

/// Rows [i0, i0+n) of (b, h) into dst[n][dim] (row-major, compute type).
template <class T>
inline void load_rows(const TensorView<const T>& v, index_t b, index_t h, index_t i0, index_t n,
                      double* dst) {
  for (index_t r = 0; r < n; ++r) {
    const T* src = v.row(b, h, i0 + r);
    double* d = dst + r * v.dim;
    for (index_t e = 0; e < v.dim; ++e) d[e] = static_cast<double>(src[e]);
  }
}

/// Rows [j0, j0+n) of (b, h) transposed into dst[dim][n].
template <class T>
inline void load_rows_transposed(const TensorView<const T>& v, index_t b, index_t h, index_t j0,
                                 index_t n, double* dst) {
  for (index_t j = 0; j < n; ++j) {
    const T* src = v.row(b, h, j0 + j);
    for (index_t e = 0; e < v.dim; ++e) dst[e * n + j] = static_cast<double>(src[e]);
  }
}

/// S[r][j] = Σ_d A[r][d] · Bt[d][j] for r < nA, j < nB. Each element is the
/// sequential sum over d (vectorised across j only), so its value does not
/// depend on the tile it belongs to; raw_dot below gives the same bits.
inline void tile_product(const double* A, index_t nA, index_t depth, const double* Bt, index_t nB,
                         double* S) {
  for (index_t r = 0; r < nA; ++r) {
    double* s = S + r * nB;
    for (index_t j = 0; j < nB; ++j) s[j] = 0.0;
    const double* a = A + r * depth;
    for (index_t d = 0; d < depth; ++d) {
      const double x = a[d];
      const double* bt = Bt + d * nB;
      CONTINUUM_PRAGMA_SIMD
      for (index_t j = 0; j < nB; ++j) s[j] += x * bt[j];
    }
  }
}

/// One raw score q·k in double, summed in the same order as tile_product.
template <class T>
inline double raw_dot(const T* q, const T* k, index_t depth) {
  double s = 0.0;
  for (index_t d = 0; d < depth; ++d) s += static_cast<double>(q[d]) * static_cast<double>(k[d]);
  return s;
}

/// y[0..n) += a · x[0..n)
inline void axpy(double* y, double a, const double* x, index_t n) {
  CONTINUUM_PRAGMA_SIMD
  for (index_t e = 0; e < n; ++e) y[e] += a * x[e];
}

/// The online update of one row over one key tile (SPEC §5, numerical form).
/// srow holds raw scores of columns [c0, c0 + ...); the row sees keys [lo, hi);
/// the tile's own keys are [ja, jb) (non-empty, inside [lo, hi)) and the
/// visible computed columns [ca, cb) include the one-column halo on each side.
/// Raises the row maximum over [ca, cb) (so every shifted score used is ≤ 0),
/// writes α̃_j for j in [ja, jb) to w, adds them to the row sum, and returns
/// the factor by which accumulators must be rescaled.
template <class Stencil>
inline double row_tile_update(const double* srow, index_t c0, index_t lo, index_t hi, index_t ja,
                              index_t jb, index_t ca, index_t cb, double c,
                              detail::OnlineRow<double>& st, double* w) {
  double tmax = -__builtin_huge_val();
  for (index_t j = ca; j < cb; ++j) {
    const double x = srow[j - c0];
    if (x > tmax) tmax = x;
  }
  const double f = st.raise(tmax, c);
  const double m = st.m;
  detail::row_stencil<Stencil>(
      lo, hi, ja, jb, [&](index_t j) { return detail::shifted_score(c, srow[j - c0], m); }, w,
      [](index_t) { return 0.0; }, nullptr);
  for (index_t j = ja; j < jb; ++j)
    if (w[j - ja] != 0.0) st.sum += w[j - ja];
  return f;
}

}  // namespace cpu_detail
}  // namespace continuum
