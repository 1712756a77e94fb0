// backends/cpu/tile.hpp — tiles of the CPU backend: block sizes, per-thread
// workspace, loading strided views into compute-type tiles, the score tile
// product and the per-row online update over one key tile (shared by the
// forward and the backward so that both see bit-identical row statistics).
#pragma once

#include <cmath>
#include <type_traits>
#include <vector>

#include "../../attention/params.hpp"
#include "../../attention/validate.hpp"
#include "../../attention/visibility.hpp"
#include "../../detail/row_state.hpp"
#include "isa.hpp"

#if defined(_OPENMP)
#  define CONTINUUM_PRAGMA_SIMD _Pragma("omp simd")
#else
#  define CONTINUUM_PRAGMA_SIMD
#endif

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

/// Query rows per block and keys per tile. Key tiles are aligned to multiples
/// of block_k globally, so a row meets the same tiles in the same order
/// whatever block it belongs to: a KV-cache decode row (Lq = 1) is computed
/// bit for bit like the same row of the full causal forward (MATH.md §7.9).
inline constexpr index_t block_q = 16;
inline constexpr index_t block_k = 64;

/// Per-thread scratch (O(tile) memory; nothing of size Lq × Lk).
struct Workspace {
  std::vector<double> qd, qs, dod, kt, kd, vd, vt, s, dp, acc, dacc, w, ds;
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

// The raw scores of the row-exact kernels round every product before adding
// it: never contracted into an FMA, whatever the target and the compiler's
// -ffp-contract. So tile_product and raw_dot give the same bits on every
// instruction set (the forward finds the maximal knots by comparing them), and
// products that are exact negatives of each other cancel exactly (W13: q·k with
// ±1e310 terms, scaled by 2^-E, must not leave one product's rounding error,
// ~1e294, in an O(1) score).
#if defined(__clang__)
#  define CONTINUUM_NO_FP_CONTRACT_FN
#  define CONTINUUM_NO_FP_CONTRACT_BODY _Pragma("clang fp contract(off)")
#elif defined(__GNUC__) && !defined(__CUDACC__)
#  define CONTINUUM_NO_FP_CONTRACT_FN __attribute__((optimize("fp-contract=off")))
#  define CONTINUUM_NO_FP_CONTRACT_BODY
#else
#  define CONTINUUM_NO_FP_CONTRACT_FN
#  define CONTINUUM_NO_FP_CONTRACT_BODY
#endif

/// S[r][j] = Σ_d A[r][d] · Bt[d][j] for r < nA, j < nB. Each element is the
/// sequential sum over d (vectorised across j only), so its value does not
/// depend on the tile it belongs to; raw_dot below gives the same bits.
CONTINUUM_NO_FP_CONTRACT_FN
inline void tile_product(const double* A, index_t nA, index_t depth, const double* Bt, index_t nB,
                         double* S) {
  CONTINUUM_NO_FP_CONTRACT_BODY
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
/// q may be a row of a loaded (possibly exponent-scaled) double tile.
template <class TQ, class TK>
CONTINUUM_NO_FP_CONTRACT_FN inline double raw_dot(const TQ* q, const TK* k, index_t depth) {
  CONTINUUM_NO_FP_CONTRACT_BODY
  double s = 0.0;
  for (index_t d = 0; d < depth; ++d) s += static_cast<double>(q[d]) * static_cast<double>(k[d]);
  return s;
}

// ---------------------------------------------------------------------------
// Scores beyond the double range (MATH.md appendix A W13, double storage).
//
// For double storage the raw score r = q·k can exceed DBL_MAX although q and
// k are finite (q = 1e10, k = 1e300): unscaled, r overflows to ±∞, the row
// maximum becomes +∞ and the shift ∞ − ∞ (or a dot product summing +∞ and
// −∞ products) gives NaN; a −∞ score is wrong too when c = scale/τ is tiny.
// A query block therefore first runs unscaled; if the storage is double and
// a visible raw score of row i is not finite (has_nonfinite), the block is
// redone with, for each such row, an exponent E_i ≥ 0 (score_exponent:
// D·max|q_i|·max|k| < 2^{1021+E_i}, max|k| over the finite elements of the
// row's visible keys) and scores r̂ = (2^{−E_i} q_i)·k, which never overflow, not even
// in a partial sum. The row maximum m̂ is kept in the same units and the
// shifted score is s̃ = c·(r̂ − m̂)·2^{E_i} (shifted_score_scaled: exact apart
// from one rounding of the product, saturating to −∞). Every other row (E_i
// = 0) is computed exactly as unscaled, bit for bit; whether a row is scaled
// depends only on its query and visible keys, not on its block (a KV-cache
// decode row still equals the full forward's). Float storage never needs it
// (D·FLT_MAX² ≪ 2^1021 in double), so its path has no check at all. Cost of scaling: q components
// below 2^{E_i−1022} lose bits (absolute error ≤ 2^{E_i−1074} per product,
// E_i ≤ 1100, far below the rounding of the largest products).

/// True when some score of s[0, n) is ±∞ or NaN.
inline bool has_nonfinite(const double* s, index_t n) {
  bool bad = false;
  for (index_t j = 0; j < n; ++j) bad |= !(std::fabs(s[j]) <= __DBL_MAX__);
  return bad;
}

/// max |x| over the finite elements of rows [j0, j1) of (b, h) (0 if none).
template <class T>
inline double max_abs_finite(const TensorView<const T>& v, index_t b, index_t h, index_t j0, index_t j1) {
  double m = 0.0;
  for (index_t j = j0; j < j1; ++j) {
    const T* r = v.row(b, h, j);
    for (index_t e = 0; e < v.dim; ++e) {
      const double x = std::fabs(static_cast<double>(r[e]));
      if (x > m && x <= __DBL_MAX__) m = x;
    }
  }
  return m;
}

/// E ≥ 0 with D·qmax·kmax·2^{−E} < 2^1021 (qmax, kmax over finite elements;
/// 0 when that holds with E = 0).
inline int score_exponent(double qmax, double kmax, index_t depth) {
  if (!(qmax > 0.0) || !(kmax > 0.0)) return 0;
  int ed = 0;
  while (ed < 63 && (index_t(1) << ed) < depth) ++ed;
  const int bound = std::ilogb(qmax) + std::ilogb(kmax) + 2 + ed;  // > log2(D·qmax·kmax)
  return bound > 1021 ? bound - 1021 : 0;
}

/// Exponent E_i of a loaded query row q (length D) against keys of finite
/// magnitude ≤ kmax (the row's visible keys); scales the row by 2^{−E_i} in
/// place.
inline int scale_query_row(double* q, index_t depth, double kmax) {
  double qmax = 0.0;
  for (index_t e = 0; e < depth; ++e) {
    const double x = std::fabs(q[e]);
    if (x > qmax && x <= __DBL_MAX__) qmax = x;
  }
  const int ex = score_exponent(qmax, kmax, depth);
  if (ex != 0)
    for (index_t e = 0; e < depth; ++e) q[e] = std::ldexp(q[e], -ex);
  return ex;
}

/// bad[r] for the rows r < nq of a loaded query block qd ([nq][D]) whose
/// visible raw scores (keys rg[r]) include a non-finite one, by a sweep over
/// the key tiles of [klo, khi); returns whether any row is bad. Uses ws.kt,
/// ws.s.
template <class T, class Ws>
bool nonfinite_score_rows(const TensorView<const T>& key, index_t b, index_t hk, const double* qd,
                          index_t nq, index_t D, const KeyRange* rg, index_t klo, index_t khi, Ws& ws,
                          bool* bad) {
  bool any = false;
  for (index_t r = 0; r < nq; ++r) bad[r] = false;
  for (index_t k0 = (klo / block_k) * block_k; k0 < khi; k0 += block_k) {
    const index_t k1 = (k0 + block_k) < khi ? (k0 + block_k) : khi;
    const index_t ka = k0 > klo ? k0 : klo, nc = k1 - ka;
    Ws::fit(ws.kt, nc * D);
    Ws::fit(ws.s, nq * nc);
    load_rows_transposed(key, b, hk, ka, nc, ws.kt.data());
    tile_product(qd, nq, D, ws.kt.data(), nc, ws.s.data());
    for (index_t r = 0; r < nq; ++r) {
      const index_t ja = ka > rg[r].lo ? ka : rg[r].lo, jb = k1 < rg[r].hi ? k1 : rg[r].hi;
      if (ja < jb && has_nonfinite(ws.s.data() + r * nc + (ja - ka), jb - ja)) bad[r] = any = true;
    }
  }
  return any;
}

/// c·x·2^e for finite c > 0 and e > 0 without intermediate overflow or
/// underflow: one rounding of the product of the significands, then an exact
/// scaling (saturating to ±∞, or rounding once into the subnormal range).
inline double mul_pow2(double c, double x, int e) {
  if (!std::isfinite(x) || x == 0.0) return c * x;
  int ce = 0, xe = 0;
  const double cm = std::frexp(c, &ce), xm = std::frexp(x, &xe);
  return std::ldexp(cm * xm, ce + xe + e);
}

/// Shifted score s̃ = c·(r̂ − m̂)·2^e of a row with score exponent e; for e = 0
/// exactly detail::shifted_score(c, r, m).
inline double shifted_score_scaled(double c, double r, double m, int e) {
  return e == 0 ? c * (r - m) : mul_pow2(c, r - m, e);
}

/// c·m̂·2^e (the lse's c·m term in score units).
inline double scaled_max(double c, double m, int e) { return e == 0 ? c * m : mul_pow2(c, m, e); }

/// y[0..n) += a · x[0..n)
inline void axpy(double* y, double a, const double* x, index_t n) {
  CONTINUUM_PRAGMA_SIMD
  for (index_t e = 0; e < n; ++e) y[e] += a * x[e];
}

/// The online update of one row over one key tile (MATH.md §5, numerical form).
/// srow holds raw scores of columns [c0, c0 + ...); the row sees keys [lo, hi);
/// the tile's own keys are [ja, jb) (non-empty, inside [lo, hi)) and the
/// visible computed columns [ca, cb) include the one-column halo on each side.
/// Raises the row maximum over [ca, cb) (so every shifted score used is ≤ 0),
/// writes α̃_j for j in [ja, jb) to w, adds them to the row sum, and returns
/// the factor by which accumulators must be rescaled.
/// ex is the row's score exponent (raw scores and st.m in units of 2^ex).
template <class Stencil>
inline double row_tile_update(const double* srow, index_t c0, index_t lo, index_t hi, index_t ja,
                              index_t jb, index_t ca, index_t cb, double c, int ex,
                              detail::OnlineRow<double>& st, double* w) {
  double tmax = -__builtin_huge_val();
  for (index_t j = ca; j < cb; ++j) {
    const double x = srow[j - c0];
    if (x > tmax) tmax = x;
  }
  double f = 1.0;
  if (ex == 0) {
    f = st.raise(tmax, c);
  } else if (tmax > st.m) {  // OnlineRow::raise with the scaled shift
    f = (st.m == -__builtin_huge_val()) ? 0.0 : std::exp(shifted_score_scaled(c, st.m, tmax, ex));
    st.m = tmax;
    st.sum *= f;
  }
  const double m = st.m;
  detail::row_stencil<Stencil>(
      lo, hi, ja, jb, [&](index_t j) { return shifted_score_scaled(c, srow[j - c0], m, ex); }, w,
      [](index_t) { return 0.0; }, nullptr);
  for (index_t j = ja; j < jb; ++j)
    if (w[j - ja] != 0.0) st.sum += w[j - ja];
  return f;
}

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
