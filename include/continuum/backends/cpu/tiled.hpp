// backends/cpu/tiled.hpp — the CPU kernels (FlashAttention-2 style tiles) for
// the forward and backward of continuum, softmax and focal attention: the one
// kernel family of the CPU backend, templated on the compute type T (float,
// double, and long double for the rows double cannot hold; backends/cpu.hpp)
// and on the stencil policy (math/density.hpp: ContinuumStencil, the
// three-point stencil; SoftmaxStencil, e^s, for softmax and focal).
//
// Forward (MATH.md §4–§5, "numerical form"): one task per (batch, query head,
// block of kBr query rows), tasks spread over OpenMP threads (dynamic schedule,
// heaviest causal blocks first). A decode step (every query row of a head, or
// of a GQA group, in one task) over at least 2·kSplitKeys keys is also split
// over the key axis: chunks of kSplitKeys keys, each a task of its own, then
// the chunks' (max, sum, P·V) combined in chunk order (MATH.md §10). A task walks the key range its rows can see in
// tiles of kBc keys; tiles outside every row's range are skipped, not masked.
// Per tile:
//   S  = (c_i q_i) · K_tileᵀ               tile GEMM (c_i = scale / τ_i folded into q)
//   running row max m_i, rescale of the accumulators (online softmax);
//   W  = stencil weights α_ij e^{-m_i}     one fused vector pass per row: exp,
//                                          segment weights (vector_moments.hpp), sum
//   O += W · V                             tile GEMM (tile_gemm.hpp)
// Continuum's stencil needs each key's two neighbours: column 0 of a score tile
// is the halo (the previous tile's last key), carried over from the previous
// tile; the segment (halo, first key) gives the halo key its right-hand weight,
// so W has kBc + 1 columns and the PV product includes the halo key's value.
// A key's right-hand weight therefore arrives one tile later: a row that goes
// on past a tile holds its last key back (carry) and adds that key's
// left-hand weight to the next tile's halo column, so that every key's α
// enters the sums as one term. The row's reference key (its first key at the
// maximum) and its near keys (ref ± 1; softmax: ref alone) stay out of O and
// l (near_w) and join them at the end, or when a later tile moves the
// reference: O and l are then the far keys' sums, which the row statistics
// for the backward (RowStatistics, when asked for) are made of (MATH.md §6).
//
// Backward (MATH.md §6): one task per (batch, key head); the task owns dK, dV of
// that head and dQ of every query head of its GQA group, and walks key tiles
// (outer) × query tiles (inner) in a fixed order, so results are bitwise
// independent of the thread count and there are no atomics. Per tile, with one
// halo key on each side (so every key of the tile sees both neighbours; key
// tiles of kBcBwd - 2 keys, so that S and dP are kBcBwd columns):
//   S, dP = dO · Vᵀ (GEMMs, kBcBwd columns), E = e^{s - m}/Z, g = (dP - dP_ref) - δ,
//   P (α / Z), dS (tridiagonal stencil), dV += Pᵀ dO, dK += dSᵀ (c q), dQ += dS K.
// The row statistics (max m = s_ref, reference key ref, Z, δ = Dl - dP_ref, dS_ref)
// come from the forward's (RowStatistics: the caller's, else a forward run
// here on the rows the backward takes): Z̃ and the far keys' Σ α̃ (v − v_ref),
// whose product with dO is Σ_far α̃ (dP − dP_ref); the near keys' terms are
// formed here, in the reference-key form (reference_grad_score), which does
// not cancel when attention is concentrated; the caller's lse and out are
// not read.
// Inspection maps (P, π; small inputs): written per finished row by the
// forward (write_maps), from the same scores and stencil.
// Masking is structural: every product that sums over keys or queries
// (P·V, dS·K, Pᵀ·dO, dSᵀ·Q) sums only the pairs that see each other
// (range_gemm), and which rows the tiled kernels take depends only on the data
// each row sees (row_eligibility, or in a decode step measure_keys). Score
// products of hidden pairs are formed in the S and dP tiles (element by
// element, never summed) and never read.
// The Lq × Lk matrices are never stored: memory is O(tiles + rows).
// bfloat16 storage computed in float, on a bfloat16 unit (bf16::Unit: AMX-BF16
// tiles or AVX512-BF16 vectors, the one the caller chose: cpu.hpp): the forward's S and
// P·V and all the backward's products (S, dP; dV, dK, dQ with P and dS rounded
// to bfloat16) run on it (bf16_products.hpp,
// MATH.md §10, "bfloat16 products"), the rest as above.
// 16-bit queries, keys and values (Stored<S>, S = bfloat16 or float16) are
// read by the forward in their storage type, and its output written there,
// so that a decode step never copies its whole KV cache to float: a query row
// is widened where it is scaled, a key tile in registers (exactly) as it is
// transposed, a value tile into the workspace, the magnitude pass widens in
// registers too, and each output row is rounded once where it is finished;
// the products see the same floats.
//
// GQA: query head h reads key/value head h / (Hq / Hk) through the views, no copy.
// OpenMP: one parallel region per call, never nested (serial when called from
// inside a parallel region); the caller's FP environment is not touched.
#pragma once

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <utility>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include <Eigen/Core>

#if defined(_OPENMP)
#  include <omp.h>
#endif
#if (defined(__SSE__) || defined(_M_X64)) && !defined(CONTINUUM_CPU_MXCSR)
#  include <xmmintrin.h>  // _mm_getcsr, _mm_setcsr (CallerFloatModes)
#  define CONTINUUM_CPU_MXCSR 1
#endif

#include "../../attention/params.hpp"
#include "../../attention/visibility.hpp"
#include "../row_state.hpp"
#include "bf16_products.hpp"
#include "spare_pool.hpp"
#include "storage16.hpp"
#include "tile_gemm.hpp"
#include "vector_moments.hpp"
#include "isa.hpp"

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {
/// The tiled kernels (entry points forward_tiled, backward_tiled).
namespace tiled {

/// Tile sizes (rows of queries × keys). The forward's rows hold their scores
/// and weights for a whole key tile, so that each row's maximum, rescaling
/// and sums (horizontal reductions across the vector lanes) run once per 512
/// keys, not once per 128: 4-9 % of a bfloat16 forward on an AMD Zen 5
/// (docs/PERFORMANCE.md, "Forward key tiles of 512"). S and W hold one
/// sub-block's kBs rows (136 KiB each in float), which the task's sub-blocks
/// reuse, so that they stay in L2 ("One sub-block's score and weight tiles,
/// and each thread's own heads").
inline constexpr index_t kBr = 256;  // query rows per task (forward)
inline constexpr index_t kBs = 64;   // query rows per GEMM sub-block (causal skipping)
inline constexpr index_t kBc = 512;  // keys per tile (forward)
/// Keys per chunk of a decode step's key-axis split (forward_tiled).
inline constexpr index_t kSplitKeys = 2048;
static_assert(kSplitKeys % kBc == 0, "a decode chunk holds whole key tiles");
inline constexpr index_t kBrBwd = 64;   // query rows per tile (backward)
inline constexpr index_t kHeadCacheBytes = index_t(16) << 20;  // a thread's packed K, V of one head (forward, a unit)
inline constexpr index_t kBcBwd = 128;  // keys per tile (backward)
/// Keys per block of the magnitude pass's range maxima (row_eligibility).
inline constexpr index_t kNormBlock = 128;
/// The most rows of a decode step's task (all rows of its head group) that
/// measure their eligibility as they read the key tiles (forward_tiled).
inline constexpr index_t kMeasureRows = 16;
static_assert(kMeasureRows <= kBs, "a measuring task is one sub-block: each key is measured once");

template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using StridedMap = Eigen::Map<RowMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using ConstStridedMap = Eigen::Map<const RowMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

/// Vector width used to pad packed tiles (1 for the scalar loops).
template <class T>
inline constexpr index_t kPad = kLanes<T>;

inline index_t round_up(index_t n, index_t m) { return (n + m - 1) / m * m; }

/// +0 for either zero, x otherwise. A bfloat16 unit flushes a denormal sum to
/// −0, and the 0 · x terms of data the element cannot see would then decide
/// the zero's sign: its results are written through this. (A compare, not
/// x + 0, which keeps −0 when the caller rounds downward.)
template <class T>
inline T unsigned_zero(T x) {
  return x == T(0) ? T(0) : x;
}

#if defined(CONTINUUM_CPU_SIMD)
/// The W = Simd<float>::W floats at p, or W 16-bit values (bfloat16,
/// float16) widened to float in registers, exactly: the values convert_n
/// gives (storage16.hpp), without a store and a reload.
template <class S>
inline typename Simd<float>::v load_float(const S* p) {
  using V = typename Simd<float>::v;
  constexpr int W = Simd<float>::W;
  if constexpr (std::is_same<S, float>::value) {
    return Simd<float>::load(p);
  } else if constexpr (std::is_same<S, bfloat16>::value) {
    // each 16-bit pattern becomes the high half of a float whose low half is 0
    typedef std::uint16_t H __attribute__((vector_size(2 * W), aligned(2), may_alias));
    typedef std::uint32_t U __attribute__((vector_size(4 * W)));
    return (V)(__builtin_convertvector(*reinterpret_cast<const H*>(p), U) << 16);
  } else {
    static_assert(std::is_same<S, float16>::value, "load_float: float, bfloat16 or float16");
#  if defined(__AVX512F__)
    if constexpr (W == 16) return (V)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#  endif
#  if defined(__F16C__)
    if constexpr (W == 8) return (V)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    if constexpr (W == 4) return (V)_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#  endif
    V x;  // no F16C (the sse2 kernels): Eigen's scalar conversion
    for (int i = 0; i < W; ++i) x[i] = float(p[i]);
    return x;
  }
}
#endif

/// dst (cols × ldd, row-major) = rowsᵀ: dst[d·ldd + c] = T(src[c·lds + d]) for
/// c < n, and 0 for n ≤ c < ldd (padding up to the vector width). Rows stored
/// in bfloat16 or float16 (T = float) are widened in registers, exactly.
template <class T, class S>
inline void pack_transposed(const S* src, index_t lds, index_t n, index_t cols, T* dst, index_t ldd) {
  static_assert(std::is_same<S, T>::value || (std::is_same<T, float>::value && is_storage16_v<S>),
                "pack_transposed: rows of T, or 16-bit rows packed as float");
  index_t c = 0;
#if defined(CONTINUUM_CPU_SIMD)
  // W × W blocks transposed in registers (a scalar transpose costs about as
  // much as a tenth of the tile's score product).
  if constexpr (kVector<T>) {
  using V = Simd<T>;
  constexpr int W = V::W;
  const index_t cols_w = cols / W * W;
  for (; c + W <= n; c += W) {
    for (index_t d = 0; d < cols_w; d += W) {
      typename V::v r[W];
      for (int i = 0; i < W; ++i) {
        if constexpr (std::is_same<S, T>::value)
          r[i] = V::load(src + (c + i) * lds + d);
        else
          r[i] = load_float(src + (c + i) * lds + d);
      }
      transpose_block<T>(r);
      for (int i = 0; i < W; ++i) V::store(dst + (d + i) * ldd + c, r[i]);
    }
    for (index_t d = cols_w; d < cols; ++d)
      for (int i = 0; i < W; ++i) dst[d * ldd + c + i] = T(src[(c + i) * lds + d]);
  }
  }
#endif
  for (index_t d = 0; d < cols; ++d) {
    T* out = dst + d * ldd;
    for (index_t k = c; k < n; ++k) out[k] = T(src[k * lds + d]);
    std::fill(out + std::max(c, n), out + ldd, T(0));
  }
}

#if defined(CONTINUUM_TILE_GEMM)
/// The scores of a few rows, as a decode step has them (the query heads of
/// one KV head): S(r, c) = Σ_d Q(r, d) · K(c, d) for the tile columns
/// [c0, c1) (multiples of the vector width; keys at or past nc are zero keys)
/// and the NR ≤ kMR rows Q(r, :) = Q + r·ldq, written to S + r·lds + c.
/// Each W × W block of key rows is transposed in registers and multiplied at
/// once: per score, the operations of pack_transposed then gemm (the same
/// floats, a running multiply-add in d order from +0, the same zero keys),
/// without Kᵀ's round trip through memory.
template <int NR, class T, class S>
inline void few_row_scores(const T* Q, index_t ldq, const S* key, index_t ldk, index_t nc, index_t D, index_t c0,
                           index_t c1, T* S_, index_t lds) {
  using V = Simd<T>;
  constexpr int W = V::W;
  const index_t Dw = D / W * W;
  for (index_t c = c0; c < c1; c += W) {
    typename V::v acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = typename V::v{};
    const int keys = int(std::clamp<index_t>(nc - c, 0, W));
    for (index_t d = 0; d < Dw; d += W) {
      typename V::v k[W];
      for (int i = 0; i < W; ++i) {
        if (i >= keys)
          k[i] = typename V::v{};
        else if constexpr (std::is_same<S, T>::value)
          k[i] = V::load(key + (c + i) * ldk + d);
        else
          k[i] = load_float(key + (c + i) * ldk + d);
      }
      transpose_block<T>(k);
      for (int i = 0; i < W; ++i)
        for (int r = 0; r < NR; ++r) acc[r] = vmadd<T>(Q[r * ldq + d + i], k[i], acc[r]);
    }
    for (index_t d = Dw; d < D; ++d) {  // head_dim not a multiple of W: one column of Kᵀ at a time
      typename V::v kd{};
      for (int i = 0; i < keys; ++i) kd[i] = T(key[(c + i) * ldk + d]);
      for (int r = 0; r < NR; ++r) acc[r] = vmadd<T>(Q[r * ldq + d], kd, acc[r]);
    }
    for (int r = 0; r < NR; ++r) V::store(S_ + r * lds + c, acc[r]);
  }
}
#endif

/// C (M × N) = or += A · B with A(r, k) = A[r·sa_r + k·sa_k], B and C row-major:
/// the micro-kernel (tile_gemm.hpp) with GCC/Clang, plain loops otherwise.
template <class T>
inline void gemm(index_t M, index_t N, index_t K, const T* A, index_t sa_r, index_t sa_k, const T* B, index_t ldb,
                 T* C, index_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    // The empty sum (D = 0 or Dv = 0): C = 0, or unchanged when accumulating.
    // A and B are then views of empty workspace matrices, whose data() is
    // null: no offset may be formed from them (UBSan), so return before any is.
    if (!accumulate)
      for (index_t r = 0; r < M; ++r) std::fill(C + r * ldc, C + r * ldc + N, T(0));
    return;
  }
#if defined(CONTINUUM_TILE_GEMM)
  if constexpr (kVector<T>) {
    tile_gemm<T>(M, N, K, A, sa_r, sa_k, B, ldb, C, ldc, accumulate);
    return;
  }
#endif
  // Plain loops: each element is the running sum over k in order, as in the
  // micro-kernel, so a row's result does not depend on M, N or the other rows
  // (a library GEMM's blocking would make a KV-cache decode step differ from
  // the full forward in the last bits).
  for (index_t r = 0; r < M; ++r) {
    T* c = C + r * ldc;
    if (!accumulate) std::fill(c, c + N, T(0));
    for (index_t k = 0; k < K; ++k) {
      const T a = A[r * sa_r + k * sa_k];
      const T* b = B + k * ldb;
#  pragma omp simd
      for (index_t n = 0; n < N; ++n) c[n] = madd(a, b[n], c[n]);
    }
  }
}

/// Masked tile product, the structural form of masking: for every row m < M,
///   C(m, :) += Σ_{k ∈ [kb[m], ke[m])} A(m, k) · B(k, :),
/// A(m, k) = A[m·sa_r + (k − koff)·sa_k], B(k, :) = B + k·ldb, C(m, :) = C + m·ldc.
/// Each row sums exactly its own k-range, in ascending k: a term outside it is
/// never formed (not 0 × value: a NaN or Inf that the row must not see cannot
/// reach it), and since every element is a running sum over k in order
/// (tile_gemm.hpp, explicit multiply-add), a row's bits depend only on its own
/// range and data, never on how rows are grouped. Rows go in runs of up to
/// kGroup consecutive rows with non-empty ranges: the run's common range is one
/// tile product, the ragged ends are products of one row (left end before, right
/// end after, so the order of terms stays ascending).
inline constexpr index_t kGroup = 6;  // = the micro-kernel's row block

template <class T>
inline void range_gemm(index_t M, index_t N, const T* A, index_t sa_r, index_t sa_k, index_t koff, const T* B,
                       index_t ldb, T* C, index_t ldc, const index_t* kb, const index_t* ke) {
  auto one = [&](index_t m, index_t k0, index_t k1) {
    if (k1 > k0)
      gemm<T>(1, N, k1 - k0, A + m * sa_r + (k0 - koff) * sa_k, sa_r, sa_k, B + k0 * ldb, ldb, C + m * ldc, ldc,
              true);
  };
  for (index_t m = 0; m < M;) {
    if (kb[m] >= ke[m]) {
      ++m;
      continue;
    }
    index_t g1 = m + 1;
    index_t lo = kb[m], hi = ke[m];
    while (g1 < M && g1 - m < kGroup && kb[g1] < ke[g1]) {
      lo = std::max(lo, kb[g1]);
      hi = std::min(hi, ke[g1]);
      ++g1;
    }
    if (lo < hi && g1 - m > 1) {
      for (index_t r = m; r < g1; ++r) one(r, kb[r], lo);
      gemm<T>(g1 - m, N, hi - lo, A + m * sa_r + (lo - koff) * sa_k, sa_r, sa_k, B + lo * ldb, ldb, C + m * ldc,
              ldc, true);
      for (index_t r = m; r < g1; ++r) one(r, hi, ke[r]);
    } else {
      for (index_t r = m; r < g1; ++r) one(r, kb[r], ke[r]);
    }
    m = g1;
  }
}

/// The transposed case of the backward (dK, dV): output row c (a key) sums
/// over the query rows r < R that see it, A(c, r) = A[c + r·lda] (P or dS,
/// row-major R × ncols), B(r, :) = B + r·ldb, C(c, :) = C + c·ldc; row r sees
/// the key columns [ov0[r], ov1[r]). Where the rows that see each key are
/// consecutive (causal, windows, monotone ranges) this is range_gemm with the
/// row interval of each key; otherwise (arbitrary explicit ranges) each key
/// sums its runs of consecutive rows one product at a time, in ascending r.
/// Where both ends of the rows' ranges are non-decreasing in r (full, causal,
/// sliding windows) the rows that see key c are [first r with ov1[r] > c,
/// first r with ov0[r] > c), found for all keys in one sweep of each end
/// (O(R + ncols); the scan below is O(R · ncols), which took about half as
/// long as the products it fed: docs/PERFORMANCE.md, "The backward's key
/// intervals"). Either way the same intervals, so the same products.
template <class T>
inline void key_range_gemm(index_t ncols, index_t R, index_t N, const T* A, index_t lda, const T* B, index_t ldb,
                           T* C, index_t ldc, const index_t* ov0, const index_t* ov1, index_t* rb, index_t* re) {
  bool monotone = true;
  for (index_t r = 1; r < R && monotone; ++r) monotone = ov0[r - 1] <= ov0[r] && ov1[r - 1] <= ov1[r];
  if (monotone) {
    index_t first = 0, past = 0;  // the first row that ends after c; the first that starts after c
    for (index_t c = 0; c < ncols; ++c) {
      while (first < R && ov1[first] <= c) ++first;
      while (past < R && ov0[past] <= c) ++past;
      rb[c] = first;
      re[c] = past;  // ≤ first: no row sees c (range_gemm skips it)
    }
    range_gemm<T>(ncols, N, A, 1, lda, 0, B, ldb, C, ldc, rb, re);
    return;
  }
  bool intervals = true;
  for (index_t c = 0; c < ncols; ++c) {
    index_t r = 0;
    while (r < R && !(ov0[r] <= c && c < ov1[r])) ++r;
    rb[c] = r;
    while (r < R && ov0[r] <= c && c < ov1[r]) ++r;
    re[c] = r;
    for (; r < R && intervals; ++r) intervals = !(ov0[r] <= c && c < ov1[r]);
  }
  if (intervals) {
    range_gemm<T>(ncols, N, A, 1, lda, 0, B, ldb, C, ldc, rb, re);
    return;
  }
  for (index_t c = 0; c < ncols; ++c)
    for (index_t r = 0; r < R;) {
      if (!(ov0[r] <= c && c < ov1[r])) {
        ++r;
        continue;
      }
      index_t r1 = r + 1;
      while (r1 < R && ov0[r1] <= c && c < ov1[r1]) ++r1;
      gemm<T>(1, N, r1 - r, A + c + r * lda, 1, lda, B + r * ldb, ldb, C + c * ldc, ldc, true);
      r = r1;
    }
}

/// Visible key range [lo, hi) of query i of batch b (MATH.md §3, attention/visibility.hpp).
struct RowRange {
  index_t lo, hi;
};
inline RowRange row_range(const Visibility& v, index_t b, index_t i, index_t Lq, index_t Lk) {
  const KeyRange k = visible_range(v, b, i, Lq, Lk);
  return {k.lo, k.hi};
}

inline int resolve_threads(int requested) {
#if defined(_OPENMP)
  if (omp_in_parallel()) return 1;  // never nest
  return requested > 0 ? requested : omp_get_max_threads();
#else
  (void)requested;
  return 1;
#endif
}

/// Eigen parallelises a GEMM with OpenMP when it is called from a team of one
/// thread (it asks omp_get_max_threads()). Our tiles must stay serial (no nested
/// parallelism): inside our own parallel region, set this implicit task's
/// nthreads ICV to 1. ICVs are per data environment, so the caller's setting is
/// untouched after the region ends. (A global Eigen::setNbThreads(n > 1) by the
/// user still wins when the operator runs on one thread.)
inline void serial_eigen_in_this_region() {
#if defined(_OPENMP)
  omp_set_num_threads(1);
#endif
}

/// The caller's floating-point control modes, for every thread of a parallel
/// region. OpenMP's worker threads keep their own (round to nearest, unless the
/// program changed theirs), so a caller in another mode would get results that
/// depend on the thread count. Captured on the calling thread before the region;
/// `Adopt`, first in each thread of the region, sets that thread's rounding
/// direction and (x86-64) MXCSR's control bits — rounding, flush-to-zero,
/// denormals-are-zero, exception masks — to the caller's, and gives the thread
/// its own back at the end. Exception flags are left alone; on the calling
/// thread it changes nothing (docs/MATH.md §10, Determinism).
class CallerFloatModes {
 public:
  CallerFloatModes() : round_(std::fegetround()) {
#if defined(CONTINUUM_CPU_MXCSR)
    csr_ = _mm_getcsr() & kControl;
#endif
  }

  class Adopt {
   public:
    explicit Adopt(const CallerFloatModes& caller) : round_(std::fegetround()) {
      if (round_ != caller.round_) std::fesetround(caller.round_);  // x87 and SSE
#if defined(CONTINUUM_CPU_MXCSR)
      const unsigned csr = _mm_getcsr();
      csr_ = csr & kControl;
      if (csr_ != caller.csr_) _mm_setcsr((csr & ~kControl) | caller.csr_);
#endif
    }
    ~Adopt() {
      if (std::fegetround() != round_) std::fesetround(round_);
#if defined(CONTINUUM_CPU_MXCSR)
      const unsigned csr = _mm_getcsr();
      if ((csr & kControl) != csr_) _mm_setcsr((csr & ~kControl) | csr_);
#endif
    }
    Adopt(const Adopt&) = delete;
    Adopt& operator=(const Adopt&) = delete;

   private:
    int round_;
#if defined(CONTINUUM_CPU_MXCSR)
    unsigned csr_;
#endif
  };

 private:
  int round_;
#if defined(CONTINUUM_CPU_MXCSR)
  static constexpr unsigned kControl = 0xffc0u;  // MXCSR bits 6-15: DAZ, masks, rounding, FTZ
  unsigned csr_;
#endif
};


// ---------------------------------------------------------------------------
// Which rows the kernels in T take. They compute in T (float accumulates in
// float), so a row needs, over the data it sees (its query, its dO, and the
// keys and values in its visible range — nothing else):
//  * c_i = scale / τ_i representable in T (float: tiny τ);
//  * moderate scores: c_i ‖q_i‖ max_{j visible} ‖k_j‖ ≤ kMaxScore<T>, and
//    (hi − lo + 1) · max|v| ≤ kValueBound<T> (dP likewise in the backward).
// A row that does not qualify is handed on to the same kernels in the next
// wider type (backends/cpu.hpp: float → double → long double, MATH.md §10);
// a row with a NaN or an Inf in the data it sees is not computed at all: its
// outputs are NaN (write_nonfinite_rows). The decision is made per row, from
// visible data only, so what a row cannot see never changes how it is
// computed. Cost: one pass over Q, K, V (and dO) — except in a decode step,
// whose tasks measure the keys their rows see as they read each key tile
// (measure_keys): the same decisions, without a second pass over the KV cache.
// ---------------------------------------------------------------------------

/// The type the magnitudes of T's data are measured in: double, or T when T
/// is wider (so that finite data of T never overflows the measure).
template <class T>
using MeasureType = std::conditional_t<(sizeof(T) > sizeof(double)), T, double>;

/// Largest |v| (times the terms summed) that a row's P·V and dO·Vᵀ sums in T
/// may reach.
template <class T>
inline constexpr MeasureType<T> kValueBound = sizeof(T) == sizeof(float)    ? 1e30
                                             : sizeof(T) == sizeof(double) ? 1e290
                                                                           : std::numeric_limits<T>::max() / 65536;

/// Largest score c_i ‖q_i‖ ‖k_j‖ the kernels in T take. In float and double
/// 4096: beyond it float scores carry absolute errors ≳ 2.4e-4 (ε_float · |s|),
/// and double rows with scores that large (tiny τ, huge q·k — W12, W13) go to
/// long double, whose range holds every product of doubles. Long double takes
/// every finite score.
template <class T>
inline constexpr MeasureType<T> kMaxScore =
    sizeof(T) <= sizeof(double) ? 4096.0 : std::numeric_limits<MeasureType<T>>::max() / 65536;

/// The type row_eligibility measures T's data in: T itself for float (a
/// squared norm that overflows float only declines the row to double, which
/// measures again), MeasureType<T> otherwise.
template <class T>
using BoundType = std::conditional_t<std::is_same<T, float>::value, float, MeasureType<T>>;

/// ‖x‖₂² of one row in A (one multiply-add per element), and whether the row
/// holds a NaN or an Inf: the elements are checked only when the sum is not
/// finite (then it is +inf for finite rows whose sum overflowed A).
/// Rows stored in bfloat16 or float16 are widened in registers (load_float).
template <class A, class T>
inline A row_norm2(const T* x, index_t n, bool& bad) {
  A ss = A(0);
  index_t d = 0;
#if defined(CONTINUUM_CPU_SIMD)
  if constexpr (std::is_same<A, float>::value && (std::is_same<T, float>::value || is_storage16_v<T>)) {
    using V = typename Simd<float>::v;
    constexpr int W = Simd<float>::W;
    V s0 = {}, s1 = {};  // two chains: half the dependent additions of one (a 64-float row, AVX2: 4, not 8)
    for (; d + 2 * W <= n; d += 2 * W) {
      const V u = load_float(x + d), v = load_float(x + d + W);
      s0 += u * u;
      s1 += v * v;
    }
    if (d + W <= n) {
      const V u = load_float(x + d);
      s0 += u * u;
      d += W;
    }
    ss = hsum<float>(s0 + s1);
  }
#endif
  // (Only when elements remain: GCC adds the simd reduction's lanes one by one
  // after the loop even when it runs no iteration, which cost a KV-cache
  // decode step more than its attention.)
  if (d < n) {
#pragma omp simd reduction(+ : ss)
    for (index_t e = d; e < n; ++e) ss += A(x[e]) * A(x[e]);
  }
  bad = false;
  if (ss <= std::numeric_limits<A>::max()) return ss;
  for (index_t e = 0; e < n; ++e) bad = bad || !std::isfinite(A(x[e]));
  return std::numeric_limits<A>::infinity();
}

/// The maxima of ‖k‖² and ‖v‖² over the keys a row sees, and whether one of
/// them holds a NaN or an Inf (KeyMagnitudes::range_max, or measured as a
/// decode step reads its key tiles: forward_block).
template <class A>
struct KeysSeen {
  A kn = A(0), vn = A(0);
  char bad = 0;
  void take(const KeysSeen& o) {
    kn = std::max(kn, o.kn);
    vn = std::max(vn, o.vn);
    bad |= o.bad;
  }
};

/// Per-key magnitudes of one (batch, KV head): ‖k_j‖², ‖v_j‖² and whether k_j
/// or v_j holds a NaN or an Inf, as maxima (or) over blocks of kNormBlock keys
/// and over each key's block up to it (pre) and from it on (suf), so that the
/// value over any range [lo, hi) costs O(1 + Lk / kNormBlock) — a causal or
/// windowed row's range ends inside a block, and a key-by-key loop over that
/// end had been 14 % of a bfloat16 causal forward. One pass over K and V with
/// one multiply-add per element.
template <class A>
struct KeyMagnitudes {
  /// ‖k‖², ‖v‖² and whether a NaN or an Inf is there: one entry per key
  /// (key: its own; pre, suf: the maxima of its block up to it, from it on)
  /// or per block (blk).
  struct Maxima {
    std::vector<A> kn, vn;
    std::vector<char> bad;
    void resize(index_t n) {
      kn.resize(std::size_t(n));
      vn.resize(std::size_t(n));
      bad.resize(std::size_t(n));
    }
    void set(index_t to, const Maxima& from, index_t at) {
      kn[std::size_t(to)] = from.kn[std::size_t(at)];
      vn[std::size_t(to)] = from.vn[std::size_t(at)];
      bad[std::size_t(to)] = from.bad[std::size_t(at)];
    }
  };
  Maxima key, pre, suf, blk;
  template <class T>
  void build(const TensorView<const T>& k, const TensorView<const T>& v, index_t b, index_t hk) {
    const index_t Lk = k.seq, nb = (Lk + kNormBlock - 1) / kNormBlock;
    key.resize(Lk);
    pre.resize(Lk);
    suf.resize(Lk);
    blk.resize(nb);
    // (16-bit rows are widened in registers: converting them to memory and
    // reading them back had stalled on store forwarding, 16-byte stores and
    // 32-byte loads.)
    // The running maxima stay in registers (pre, then suf, block by block):
    // through the arrays, each key's maximum had waited for the store of the
    // one before it.
    for (index_t t = 0; t < nb; ++t) {
      const index_t j0 = t * kNormBlock, j1 = std::min(Lk, j0 + kNormBlock);
      A km = A(0), vm = A(0);
      char bad = 0;
      for (index_t j = j0; j < j1; ++j) {
        bool kb, vb;
        const A kn = row_norm2<A>(k.row(b, hk, j), k.dim, kb), vn = row_norm2<A>(v.row(b, hk, j), v.dim, vb);
        const std::size_t at = std::size_t(j);
        key.kn[at] = kn;
        key.vn[at] = vn;
        key.bad[at] = char(kb || vb);
        pre.kn[at] = km = std::max(km, kn);
        pre.vn[at] = vm = std::max(vm, vn);
        pre.bad[at] = bad |= key.bad[at];
      }
      km = vm = A(0);
      bad = 0;
      for (index_t j = j1 - 1; j >= j0; --j) {
        const std::size_t at = std::size_t(j);
        suf.kn[at] = km = std::max(km, key.kn[at]);
        suf.vn[at] = vm = std::max(vm, key.vn[at]);
        suf.bad[at] = bad |= key.bad[at];
      }
      blk.set(t, suf, j0);
    }
  }
  /// The magnitudes of the keys [lo, hi) (lo < hi).
  KeysSeen<A> range_max(index_t lo, index_t hi) const {
    KeysSeen<A> seen;
    const auto take = [&](const Maxima& m, index_t at) {
      seen.take({m.kn[std::size_t(at)], m.vn[std::size_t(at)], m.bad[std::size_t(at)]});
    };
    const index_t first = lo / kNormBlock, last = (hi - 1) / kNormBlock;
    if (first == last) {  // within one block
      const index_t end = std::min((first + 1) * kNormBlock, index_t(key.kn.size()));
      if (lo == first * kNormBlock)
        take(pre, hi - 1);
      else if (hi == end)
        take(suf, lo);
      else  // at most kNormBlock - 2 keys, the row's own
        for (index_t j = lo; j < hi; ++j) take(key, j);
    } else {
      take(suf, lo);
      for (index_t t = first + 1; t < last; ++t) take(blk, t);
      take(pre, hi - 1);
    }
    return seen;
  }
};

/// Row states of a call, indexed by the row id (b·Hq + h)·Lq + i.
enum RowState : char {
  kDeclined = 0,   ///< visible data the kernels in T do not take: handed to the next wider type
  kTiled = 1,      ///< computed by the kernels in T
  kNotOurs = 2,    ///< outside the call's row subset: left alone
  kNonFinite = 3,  ///< a NaN or an Inf in the data the row sees: its outputs are NaN
};

/// The row ids whose state is `state`, ascending.
inline std::vector<index_t> rows_in_state(const std::vector<char>& ok, char state) {
  std::vector<index_t> rows;
  for (std::size_t r = 0; r < ok.size(); ++r)
    if (ok[r] == state) rows.push_back(index_t(r));
  return rows;
}

/// Whether a bfloat16 unit's flushes are below float rounding in a sum of n
/// products x·y with |x| ≤ X, |y| ≤ Y. The unit treats denormal inputs as 0
/// and flushes every denormal product and partial sum to 0 (bf16_products.hpp),
/// which loses at most 2^-126 · n · (1 + X + Y) in all; that must be at most
/// 2^-24 · X · Y, the scale of the float sum's own rounding. (Evaluated in
/// double; a bound that underflowed to 0 in T fails it, which only declines.)
inline bool unit_flush_negligible(double n, double X, double Y) {
  return std::ldexp(1.0, -126) * n * (1 + X + Y) <= std::ldexp(1.0, -24) * X * Y;
}

/// Whether the n elements at x are all zero (then every product with them is
/// exactly 0 and nothing is flushed).
template <class T>
bool all_zero(const T* x, index_t n) {
  for (index_t d = 0; d < n; ++d)
    if (x[d] != T(0)) return false;
  return true;
}

/// The state of row (b, h, i), which sees the keys rg (not empty) with the
/// magnitudes `keys`, for the kernels in T: kTiled, kDeclined or kNonFinite
/// (see above). grad_out is null for the forward; group = query heads per KV
/// head; unscaled_scores: the products run on a bfloat16 unit.
template <class T, class S>
RowState row_state(const TensorView<const S>& query, index_t value_dim, const TensorView<const T>* grad_out,
                   const Temperature<T>& temp, double scale, index_t b, index_t h, index_t i, index_t group,
                   KeyRange rg, const KeysSeen<BoundType<T>>& keys, bool unscaled_scores) {
  using A = BoundType<T>;
  const index_t Hq = query.heads, Lq = query.seq;
  const A tau = A(temperature_at(temp, b, h, i, Hq, Lq));
  const A c = A(A(scale) / tau);
  A g2 = A(0);
  bool qbad, gbad = false;
  const A q2 = row_norm2<A>(query.row(b, h, i), query.dim, qbad);
  if (grad_out) g2 = row_norm2<A>(grad_out->row(b, h, i), grad_out->dim, gbad);
  if (keys.bad || qbad || gbad) return kNonFinite;
  // Norms bound the magnitudes (max |x_d| ≤ ‖x‖). c = scale / τ is
  // formed in T and folded into q: c and c·q must fit T.
  const A qn = std::sqrt(q2), kmax = std::sqrt(keys.kn), vmax = std::sqrt(keys.vn), gm = std::sqrt(g2);
  const A tmax = A(std::numeric_limits<T>::max());
  // unscaled_scores: the bfloat16 products form q·k before c, so
  // that must fit T too.
  bool fine = tau > 0 && c <= tmax && c * qn <= tmax / 2 && (!unscaled_scores || qn * kmax <= tmax / 2) &&
              c * qn * kmax <= A(kMaxScore<T>) && A(rg.size() + 1) * vmax <= A(kValueBound<T>);
  // dP = dO · Vᵀ stays far from overflow.
  if (fine && grad_out) fine = A(std::max(value_dim, rg.size()) + 1) * gm * vmax <= A(kValueBound<T>);
  // unscaled_scores (a bfloat16 unit): its flushes of tiny products
  // stay below float rounding (unit_flush_negligible) in each sum the
  // unit forms — q·k; the P·V sum (weights ≤ 1); and backward, dO·v,
  // dV = Σ P dO, dQ = Σ dS k and dK = Σ (c dS) q with |dS| ≤ 4 ‖dO‖ max‖v‖
  // — else the row is computed without the unit, in the wider type.
  if (fine && unscaled_scores) {
    const double n = double(std::max(rg.size(), grad_out ? Lq * group : index_t(0)) + 1);
    const double Q = double(qn), K = double(kmax), V = double(vmax), G = double(gm);
    const bool q0 = qn == A(0) && all_zero(query.row(b, h, i), query.dim);
    const bool g0 = grad_out && gm == A(0) && all_zero(grad_out->row(b, h, i), grad_out->dim);
    fine = (q0 || unit_flush_negligible(double(query.dim), Q, K)) && unit_flush_negligible(n, 1, V);
    if (fine && grad_out && !g0) {
      const double ds = 4 * G * V;  // |dS_ij| ≤ 4 ‖dO_i‖ max‖v‖ (two segments' terms, each ≤ P |dP − Dl|)
      // (dK's A side is c_i dS_ij, formed and rounded in float: it must stay finite.)
      fine = double(c) * ds <= double(tmax) / 4 && unit_flush_negligible(double(value_dim), G, V) &&
             unit_flush_negligible(n, 1, G) && unit_flush_negligible(n, ds, K) &&
             (q0 || unit_flush_negligible(n, double(c) * ds, Q));
    }
  }
  return fine ? kTiled : kDeclined;
}

/// ok[row] = kTiled for every row, kNotOurs outside subset (null = every row).
inline void init_row_states(std::vector<char>& ok, index_t rows, const char* subset) {
  ok.assign(std::size_t(rows), kTiled);
  if (subset)
    for (std::size_t r = 0; r < ok.size(); ++r)
      if (!subset[r]) ok[r] = kNotOurs;
}

/// Per-row states for the kernels in T (see above): ok[row] is a RowState.
/// The queries, keys and values may be stored in S (a 16-bit forward's own).
/// subset (null = every row) marks the rows this call computes. grad_out is
/// null for the forward. Returns the number of rows not computed in T
/// (declined or non-finite).
template <class T, class S = T>
index_t row_eligibility(const TensorView<const S>& query, const TensorView<const S>& key,
                        const TensorView<const S>& value, const TensorView<const T>* grad_out,
                        const Visibility& vis, const Temperature<T>& temp, double scale, int threads,
                        const char* subset, std::vector<char>& ok, bool unscaled_scores = false) {
  using A = BoundType<T>;
  const index_t B = query.batch, Hq = query.heads, Hk = key.heads, Lq = query.seq, Lk = key.seq;
  init_row_states(ok, B * Hq * Lq, subset);
  if (Hk <= 0 || B <= 0 || Lq <= 0 || Hq <= 0) return 0;
  const index_t group = Hq / Hk, ntasks = B * Hk;
  index_t rejected = 0;
  const CallerFloatModes modes;
#if defined(_OPENMP)
#  pragma omp parallel num_threads(threads) if (threads > 1 && ntasks > 1) reduction(+ : rejected)
#endif
  {
    const CallerFloatModes::Adopt in_caller_modes(modes);
    KeyMagnitudes<A> km;
#if defined(_OPENMP)
#  pragma omp for schedule(dynamic, 1)
#endif
    for (index_t task = 0; task < ntasks; ++task) {
      const index_t b = task / Hk, hk = task % Hk;
      km.build(key, value, b, hk);
      for (index_t h = hk * group; h < (hk + 1) * group; ++h)
        for (index_t i = 0; i < Lq; ++i) {
          char& state = ok[std::size_t((b * Hq + h) * Lq + i)];
          if (state == kNotOurs) continue;
          const KeyRange rg = visible_range(vis, b, i, Lq, Lk);
          if (rg.empty()) continue;
          state = row_state<T>(query, value.dim, grad_out, temp, scale, b, h, i, group, rg,
                               km.range_max(rg.lo, rg.hi), unscaled_scores);
          if (state != kTiled) ++rejected;
        }
    }
  }
  return rejected;
}

/// The forward outputs of the non-finite rows: out (stored in S) and lse NaN.
template <class T, class S>
void write_nonfinite_rows(const ForwardArgs<T>& a, const TensorView<S>& out, const std::vector<char>& ok) {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const index_t Hq = a.query.heads, Lq = a.query.seq, Lk = a.key.seq;
  for (index_t row : rows_in_state(ok, kNonFinite)) {
    const index_t i = row % Lq, h = (row / Lq) % Hq, b = row / (Lq * Hq);
    if (out.data) std::fill(out.row(b, h, i), out.row(b, h, i) + out.dim, S(nan));
    if (a.lse) a.lse[row] = nan;
    if (a.probs) std::fill(a.probs + row * Lk, a.probs + (row + 1) * Lk, nan);
    if (a.cell_mass) std::fill(a.cell_mass + row * Lk, a.cell_mass + (row + 1) * Lk, nan);
  }
}

/// The backward outputs of the non-finite rows: their dQ and dτ terms NaN,
/// and NaN in dK and dV of every key they see (a NaN in a row's data reaches
/// every gradient that sums over it; nothing else is touched).
template <class T>
void write_nonfinite_rows(const BackwardArgs<T>& a, const std::vector<char>& ok, std::vector<double>& dtau_rows) {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const index_t Hq = a.query.heads, Lq = a.query.seq, Lk = a.key.seq;
  const index_t group = Hq / a.key.heads;
  for (index_t row : rows_in_state(ok, kNonFinite)) {
    const index_t i = row % Lq, h = (row / Lq) % Hq, b = row / (Lq * Hq);
    const KeyRange rg = visible_range(a.visibility, b, i, Lq, Lk);
    if (a.grad_query.data) std::fill(a.grad_query.row(b, h, i), a.grad_query.row(b, h, i) + a.grad_query.dim, nan);
    if (!dtau_rows.empty()) dtau_rows[std::size_t(row)] = std::numeric_limits<double>::quiet_NaN();
    for (index_t j = rg.lo; j < rg.hi; ++j) {
      if (a.grad_key.data) std::fill(a.grad_key.row(b, h / group, j), a.grad_key.row(b, h / group, j) + a.grad_key.dim, nan);
      if (a.grad_value.data)
        std::fill(a.grad_value.row(b, h / group, j), a.grad_value.row(b, h / group, j) + a.grad_value.dim, nan);
    }
  }
}

// ---------------------------------------------------------------------------
// Row loops of the stencil. With CONTINUUM_CPU_SIMD they run on whole vectors:
// they read and write up to W - 1 elements past the end of the range, so every
// row buffer they touch carries kPad<T> spare elements; the callers overwrite
// what the tail lanes wrote where it matters (see each caller).
// ---------------------------------------------------------------------------

/// f(std::integral_constant<StencilAccuracy, A>{}) for the run-time accuracy
/// `a` (StencilAccuracy::bf16 only where T is float: vector_moments.hpp).
template <class T, class F>
inline decltype(auto) with_accuracy(StencilAccuracy a, F&& f) {
  using Full = std::integral_constant<StencilAccuracy, StencilAccuracy::full>;
  using Bf16 = std::integral_constant<StencilAccuracy, StencilAccuracy::bf16>;
  if constexpr (std::is_same<T, float>::value)
    if (a == StencilAccuracy::bf16) return f(Bf16{});
  return f(Full{});
}

/// Largest s[c] over c in [c0, c1); -inf when the range is empty. With
/// kScale, s[c] *= scale first (written back: one pass for both). A row of
/// at least one vector reads its last one whole: s holds W − 1 elements
/// past c1 (ScoreTile), which it leaves as they were.
template <bool kScale = false, class T>
inline T row_max(T* s, index_t c0, index_t c1, T scale = T(1)) {
  T m = -std::numeric_limits<T>::infinity();
  index_t c = c0;
#if defined(CONTINUUM_CPU_SIMD)
  if constexpr (kVector<T>) {
  using S = Simd<T>;
  using V = typename S::v;
  const auto load = [&](index_t at) {
    V x = S::load(s + at);
    if constexpr (kScale) {
      x *= scale;
      S::store(s + at, x);
    }
    return x;
  };
  if (c1 - c0 >= S::W) {
    V m0 = V{} + m, m1 = m0;  // two chains: the max latency is hidden
    for (; c + 2 * S::W <= c1; c += 2 * S::W) {
      const V x0 = load(c), x1 = load(c + S::W);
      m0 = x0 > m0 ? x0 : m0;
      m1 = x1 > m1 ? x1 : m1;
    }
    if (c + S::W <= c1) {
      const V x0 = load(c);
      m0 = x0 > m0 ? x0 : m0;
      c += S::W;
    }
    if (c < c1) {  // the last columns: one vector, its lanes from c1 on left out (and written back as they were)
      const typename S::vi valid = (S::lanes() + typename SimdInt<T>::type(c)) < typename SimdInt<T>::type(c1);
      V x = S::load(s + c);
      if constexpr (kScale) {
        const V y = x * scale;
        S::store(s + c, valid ? y : x);
        x = y;
      }
      x = valid ? x : V{} + m;
      m1 = x > m1 ? x : m1;
      c = c1;
    }
    m0 = m1 > m0 ? m1 : m0;
    m = hmax<T>(m0);
  }
  }
#endif
  for (; c < c1; ++c) {
    if constexpr (kScale) s[c] *= scale;
    m = s[c] > m ? s[c] : m;
  }
  return m;
}

/// The first c in [c0, c1) with s[c] == v (kScale: scale ⊗ s[c] == v); c1 when
/// there is none. (Where a row maximum is: whole vectors compared at once, the
/// lane from the mask.)
template <bool kScale = false, class T>
inline index_t row_find(const T* s, index_t c0, index_t c1, T v, T scale = T(1)) {
  index_t c = c0;
#if defined(CONTINUUM_CPU_SIMD)
  if constexpr (kVector<T>) {
    using S = Simd<T>;
    for (; c + S::W <= c1; c += S::W)
      if (const unsigned lanes = equal_lanes<T>(kScale ? S::load(s + c) * scale : S::load(s + c), v))
        return c + index_t(__builtin_ctz(lanes));
  }
#endif
  while (c < c1 && !((kScale ? s[c] * scale : s[c]) == v)) ++c;
  return c;
}

#if defined(CONTINUUM_CPU_SIMD)
/// {prev[W-1], cur[0], …, cur[W-2]}: the vector one position to the left.
template <class V, int W, int... I>
inline V shift_in_impl(V prev, V cur, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(prev, cur, (W - 1 + I)...);
}
template <class T>
inline typename Simd<T>::v shift_in(typename Simd<T>::v prev, typename Simd<T>::v cur) {
  return shift_in_impl<typename Simd<T>::v, Simd<T>::W>(prev, cur, std::make_integer_sequence<int, Simd<T>::W>{});
}

/// Runs step(c, std::false_type{}) on each whole vector of segments (c - 1 + k,
/// c + k), k < W, of the knots c0 … c1-1, then step(c, std::true_type{}) on the
/// partial last one; returns the lane of knot c1 - 1 in the last vector handled,
/// or -1 when there is one knot (no segment).
template <int W, class Step>
inline int for_segment_vectors(index_t c0, index_t c1, Step&& step) {
  index_t c = c0 + 1;
  for (; c + W <= c1; c += W) step(c, std::false_type{});
  if (c < c1) step(c, std::true_type{});
  return c1 > c0 + 1 ? int((c1 - 1 - (c0 + 1)) % W) : -1;
}
#endif

/// Continuum stencil weights of one row, fused (MATH.md §4–§5): the knots
/// c0 … c1-1 of the row buffer s are visible (c1 > c0), consecutive knots form
/// a segment, and w[c] = α_c e^{-m} = (weight from the left segment + weight
/// from the right segment) · e^{-m}, with the flat half-token cell e^{s-m}/2 at
/// the first knot when `half_lo` and at the last when `half_hi`. Returns
/// Σ_c w[c] over the knots before the last (c < c1 - 1; the last knot's weight
/// is w[c1 - 1], which a forward tile may hold back). Two passes: e^{s-m} into w, then the segment weights and the
/// sum per vector; w is written on [c0, c1 + W - 2) (zeros from c1 on), s is read on
/// [c0, c1 + W - 1): both buffers carry W spare elements.
template <class T, StencilAccuracy A = StencilAccuracy::full>
inline T row_continuum_weights(const T* s, T m, T* w, index_t c0, index_t c1, bool half_lo, bool half_hi) {
#if defined(CONTINUUM_CPU_SIMD)
  if constexpr (kVector<T>) {
  using S = Simd<T>;
  using V = typename S::v;
  using VI = typename S::vi;
  using O = VectorOps<T>;
  // The knots' exponentials: at bfloat16's accuracy from exp_stencil_bf16 (a
  // few float ulps, cheaper; MATH.md §10, "The bfloat16 stencil").
  const auto exp_knots = [](V x) {
    if constexpr (A == StencilAccuracy::bf16)
      return O::exp_stencil_bf16(x);
    else
      return O::exp_clamped(x);
  };
  const T e0 = exp_knots(O::splat(s[c0] - m))[0];
  const VI lane = S::lanes();
  V e_prev = O::splat(e0);                           // lane W-1: e at knot c - 1
  V left_prev = O::splat(half_lo ? T(0.5) * e0 : T(0));  // lane W-1: left weight of knot c - 1
  V acc{};
  T last_left = half_lo ? T(0.5) * e0 : T(0), last_e = e0;  // knot c1 - 1
  // Lane k handles the segment (j - 1, j), j = c + k < c1, and writes w[j - 1].
  // In the last, partial vector the lanes j ≥ c1 (past the row) write 0 and
  // take d = 0 (the cheap regime).
  const auto step = [&](index_t c, auto partial) {
    constexpr bool kPartial = decltype(partial)::value;
    const V x = S::load(s + c - 1), y = S::load(s + c);
    const V ey = S::load(w + c);  // e^{y - m}, from the first pass
    const V ex = shift_in<T>(e_prev, ey);
    V d = y - x;
    VI valid{};
    if constexpr (kPartial) {
      valid = (lane + typename SimdInt<T>::type(c)) < typename SimdInt<T>::type(c1);
      d = valid ? d : V{};
    }
    V right, left;  // weights of knot j - 1 and of knot j from this segment
    O::template segment_weights<A>(d, ex, ey, right, left);
    V wv = shift_in<T>(left_prev, left) + right;
    if constexpr (kPartial) wv = valid ? wv : V{};
    S::store(w + c - 1, wv);
    acc += wv;
    e_prev = ey;
    left_prev = left;
  };
  // First pass: the knots' exponentials into w (the positions the second
  // pass reads before it overwrites them). Taking exp out of the segment loop
  // shortens that loop's dependency chain, so more of its iterations overlap;
  // the values are the same.
  for (index_t c = c0 + 1; c < c1; c += S::W) S::store(w + c, exp_knots(S::load(s + c) - m));
  const int k = for_segment_vectors<S::W>(c0, c1, step);
  if (k >= 0) {  // knot c1 - 1 sits in lane k of the last vector handled
    last_left = left_prev[k];
    last_e = e_prev[k];
  }
  // The last knot: its left weight, plus the end half-cell when it has one.
  w[c1 - 1] = last_left + (half_hi ? T(0.5) * last_e : T(0));
  return hsum<T>(acc);
  } else
#endif
  {
  // (Without vector lanes exp_clamped at either accuracy: within both bounds.)
  const T e0 = exp_clamped(s[c0] - m);
  T e_prev = e0, left_prev = half_lo ? T(0.5) * e0 : T(0), sum = T(0);
  for (index_t j = c0 + 1; j < c1; ++j) {
    const T ey = exp_clamped(s[j] - m);
    T right, left;
    segment_weights<T, A>(s[j] - s[j - 1], e_prev, ey, right, left);
    w[j - 1] = left_prev + right;
    sum += w[j - 1];
    left_prev = left;
    e_prev = ey;
  }
  w[c1 - 1] = left_prev + (half_hi ? T(0.5) * e_prev : T(0));
  return sum;
  }
}

// The backward's per-row sums in W (the statistics' Z̃ and E, dτ's Σ dS·s) run
// in vector lanes of W with one tree sum (hsum) after the loop. (An `omp simd`
// reduction here cost 4-5 % of a bfloat16 forward + backward: GCC adds its
// lanes one by one after every loop, per row and key tile.)
#if defined(CONTINUUM_CPU_SIMD)
/// Whether WidenedLanes<W, T> exists: T = W, or float for W = double.
template <class W, class T>
inline constexpr bool kWidenable = kVector<W> && (std::is_same<T, W>::value ||
                                                  (std::is_same<T, float>::value && std::is_same<W, double>::value));
/// Simd<W>::W lanes of T (n), and their widening to a vector of W in registers.
template <class W, class T>
struct WidenedLanes {
  static constexpr int L = Simd<W>::W;
  typedef T n __attribute__((vector_size(sizeof(T) * L)));
  typedef T nu __attribute__((vector_size(sizeof(T) * L), aligned(alignof(T)), may_alias));
  using V = typename Simd<W>::v;
  static n load(const T* p) { return *reinterpret_cast<const nu*>(p); }
  static V widen(n x) { return __builtin_convertvector(x, V); }
};
#endif

/// Σ W(x[c]) · W(y[c] − m) over c in [c0, c1), y − m formed in T.
template <class T, class W>
inline W shifted_dot(const T* x, const T* y, T m, index_t c0, index_t c1) {
  W sum = W(0);
  index_t c = c0;
#if defined(CONTINUUM_CPU_SIMD)
  if constexpr (kWidenable<W, T>) {
    using N = WidenedLanes<W, T>;
    if (c1 - c0 >= N::L) {
      typename N::V acc = {};
      for (; c + N::L <= c1; c += N::L) acc += N::widen(N::load(x + c)) * N::widen(N::load(y + c) - m);
      sum = hsum<W>(acc);
    }
  }
#endif
  for (; c < c1; ++c) sum += W(x[c]) * W(y[c] - m);
  return sum;
}

/// w[c] = e^{s[c] - m} for c in [c0, c1); returns Σ w[c] (softmax weights).
/// Vector lanes may write w up to c1 + W - 2 (zeros from c1 on).
template <class T>
inline T row_exp_sum(const T* s, T m, T* w, index_t c0, index_t c1) {
#if defined(CONTINUUM_CPU_SIMD)
  if constexpr (kVector<T>) {
  using S = Simd<T>;
  using V = typename S::v;
  using VI = typename S::vi;
  V acc{};
  index_t c = c0;
  for (; c + S::W <= c1; c += S::W) {
    const V e = VectorOps<T>::exp_clamped(S::load(s + c) - m);
    S::store(w + c, e);
    acc += e;
  }
  if (c < c1) {  // the last, partial vector: lanes from c1 on are 0
    const VI lane = S::lanes();
    V e = VectorOps<T>::exp_clamped(S::load(s + c) - m);
    e = lane < typename SimdInt<T>::type(c1 - c) ? e : V{};
    S::store(w + c, e);
    acc += e;
  }
  return hsum<T>(acc);
  } else
#endif
  {
  T sum = T(0);
  for (index_t c = c0; c < c1; ++c) sum += (w[c] = exp_clamped(s[c] - m));
  return sum;
  }
}

/// e[c] = e^{s[c] - m} · scale for c in [c0, c1). Vector lanes also write
/// e on [c1, c1 + W - 1).
template <class T>
inline void row_exp(const T* s, T* e, T m, index_t c0, index_t c1, T scale = T(1)) {
#if defined(CONTINUUM_CPU_SIMD)
  if constexpr (kVector<T>) {
    using S = Simd<T>;
    for (index_t c = c0; c < c1; c += S::W) S::store(e + c, VectorOps<T>::exp_clamped(S::load(s + c) - m) * scale);
    return;
  }
#endif
#pragma omp simd
  for (index_t c = c0; c < c1; ++c) e[c] = exp_clamped(s[c] - m) * scale;
}

/// Softmax's gradient row (MATH.md §6) in one pass: p[c] = e^{s[c] - m} ·
/// inv_l and ds[c] = p[c] · ((dp[c] − dpref) − δ) for c in [c0, c1) (row_exp's
/// operations, then dS's). Vector lanes also write p on [c1, c1 + W - 1);
/// ds keeps its bits outside [c0, c1) (the last vector's tail is read and
/// stored back).
template <class T>
inline void row_softmax_grad(const T* s, const T* dp, T* p, T* ds, T m, T inv_l, T dpref, T delta, index_t c0,
                             index_t c1) {
#if defined(CONTINUUM_CPU_SIMD)
  if constexpr (kVector<T>) {
    using S = Simd<T>;
    using V = typename S::v;
    using VI = typename S::vi;
    const VI lane = S::lanes();
    for (index_t c = c0; c < c1; c += S::W) {
      const V pv = VectorOps<T>::exp_clamped(S::load(s + c) - m) * inv_l;
      const V dv = pv * ((S::load(dp + c) - dpref) - delta);
      S::store(p + c, pv);
      S::store(ds + c, c + S::W <= c1 ? dv : lane < typename SimdInt<T>::type(c1 - c) ? dv : S::load(ds + c));
    }
    return;
  }
#endif
  for (index_t c = c0; c < c1; ++c) {
    p[c] = exp_clamped(s[c] - m) * inv_l;
    ds[c] = p[c] * ((dp[c] - dpref) - delta);
  }
}

/// The gradient sweep's P and dS of one row (MATH.md §6), fused: the knots
/// c0 … c1-1 of the row buffers s, e and dp are visible (c1 > c0), e[c] =
/// e^{s[c] - m}/Z on [c0, c1) (the caller's), and g_c = (dp[c] − dpref) − δ.
/// Segment (c-1, c) gives knot c-1 its right-hand weight and dS term, knot c
/// its left-hand ones; the first knot has the flat half-token cell (weight
/// e/2, dS term e g/2) when `half_lo`, the last when `half_hi`. Knot c's P and
/// dS go to p[c - off] and ds[c - off], for c ≥ off (the knots before `off`
/// are halo keys: their terms only feed their neighbours). s, e and dp are
/// read on [c0, c1 + W - 1); p and ds are written on [max(c0, off) - off,
/// c1 - off + W - 2) (zeros past the last knot): all carry W spare elements.
template <class T, StencilAccuracy A = StencilAccuracy::full>
inline void row_gradient_terms(const T* s, const T* e, const T* dp, T dpref, T delta, index_t c0, index_t c1,
                               bool half_lo, bool half_hi, index_t off, T* p, T* ds) {
  const auto g_at = [&](index_t c) { return (dp[c] - dpref) - delta; };  // h − δ: exact 0 − δ at ref
  // The first knot's left-hand terms: its half-token cell, or nothing.
  const T left_w0 = half_lo ? T(0) + T(0.5) * e[c0] : T(0);
  const T left_d0 = half_lo ? T(0) + T(0.5) * e[c0] * g_at(c0) : T(0);
  T last_w = left_w0, last_d = left_d0;  // the last knot's left-hand terms
#if defined(CONTINUUM_CPU_SIMD)
  if constexpr (kVector<T>) {
  using S = Simd<T>;
  using V = typename S::v;
  using VI = typename S::vi;
  using O = VectorOps<T>;
  const VI lane = S::lanes();
  V left_w_prev = O::splat(left_w0), left_d_prev = O::splat(left_d0);  // lane W-1: knot c - 1's
  // Lane k handles the segment (j - 1, j), j = c + k < c1, and completes knot
  // j - 1. In the last, partial vector the lanes j ≥ c1 write 0 and take d = 0.
  const auto step = [&](index_t c, auto partial) {
    constexpr bool kPartial = decltype(partial)::value;
    V d = S::load(s + c) - S::load(s + c - 1);
    VI valid{};
    if constexpr (kPartial) {
      valid = (lane + typename SimdInt<T>::type(c)) < typename SimdInt<T>::type(c1);
      d = valid ? d : V{};
    }
    V wx, wy, dwx, dwy, cpl;  // knot j - 1 is x, knot j is y
    O::template segment_terms<A>(d, S::load(e + c - 1), S::load(e + c), wx, wy, dwx, dwy, cpl);
    const V gx = (S::load(dp + c - 1) - dpref) - delta, gy = (S::load(dp + c) - dpref) - delta;
    const V left_w = wy, left_d = gy * dwy + gx * cpl;  // knot j's
    V pw = wx + shift_in<T>(left_w_prev, left_w);       // knot j - 1's
    V pd = (gx * dwx + gy * cpl) + shift_in<T>(left_d_prev, left_d);
    if constexpr (kPartial) {
      pw = valid ? pw : V{};
      pd = valid ? pd : V{};
    }
    if (c - 1 >= off) {
      S::store(p + (c - 1 - off), pw);
      S::store(ds + (c - 1 - off), pd);
    } else {  // knot c - 1 is a halo key (the first vector only)
      for (int k = int(off - (c - 1)); k < S::W; ++k) {
        p[c - 1 + k - off] = pw[k];
        ds[c - 1 + k - off] = pd[k];
      }
    }
    left_w_prev = left_w;
    left_d_prev = left_d;
  };
  const int k = for_segment_vectors<S::W>(c0, c1, step);
  if (k >= 0) {  // knot c1 - 1 sits in lane k of the last vector handled
    last_w = left_w_prev[k];
    last_d = left_d_prev[k];
  }
  } else
#endif
  {
  T left_w = left_w0, left_d = left_d0;
  for (index_t j = c0 + 1; j < c1; ++j) {
    T wx, wy, dwx, dwy, cpl;  // knot j - 1 is x, knot j is y
    segment_terms<T, A>(s[j] - s[j - 1], e[j - 1], e[j], wx, wy, dwx, dwy, cpl);
    const T gx = g_at(j - 1), gy = g_at(j);
    if (j - 1 >= off) {
      p[j - 1 - off] = wx + left_w;
      ds[j - 1 - off] = (gx * dwx + gy * cpl) + left_d;
    }
    left_w = wy;
    left_d = gy * dwy + gx * cpl;
  }
  last_w = left_w;
  last_d = left_d;
  }
  // The last knot: its end half-cell (when it has one) and its left-hand terms.
  const index_t cl = c1 - 1;
  p[cl - off] = (half_hi ? T(0) + T(0.5) * e[cl] : T(0)) + last_w;
  ds[cl - off] = (half_hi ? T(0) + T(0.5) * e[cl] * g_at(cl) : T(0)) + last_d;
}

// ---------------------------------------------------------------------------
// Forward.
// ---------------------------------------------------------------------------
/// Σ x[c] over c in [c0, c1).
template <class T>
inline T row_sum(const T* x, index_t c0, index_t c1) {
  T sum = T(0);
  index_t c = c0;
#if defined(CONTINUUM_CPU_SIMD)
  if constexpr (kVector<T>) {
    using S = Simd<T>;
    if (c1 - c0 >= S::W) {
      typename S::v acc{};
      for (; c + S::W <= c1; c += S::W) acc += S::load(x + c);
      sum = hsum<T>(acc);
    }
  }
#endif
  for (; c < c1; ++c) sum += x[c];
  return sum;
}

/// o += w · v over n values; v in its storage type S is widened into
/// `scratch` (n values) first.
template <class T, class S>
inline void add_scaled(T* o, T w, const S* v, index_t n, T* scratch) {
  const T* x;
  if constexpr (std::is_same<S, T>::value) {
    x = v;
  } else {
    convert_n(v, scratch, n);
    x = scratch;
  }
#pragma omp simd
  for (index_t d = 0; d < n; ++d) o[d] = madd(w, x[d], o[d]);
}

/// The statistics a forward leaves for its backward, per row of the call
/// (row id (b·Hq + h)·Lq + i), in the compute type T (MATH.md §6, "row
/// statistics from the forward"; the layout of RowStats, params.hpp): ref[row]
/// is the reference key (its first visible key at the maximum; −1 for a row
/// without statistics), and values[row · (Dv + 5) + …] holds the row
/// maximum m (= s_ref), the α̃ of keys ref − 1, ref, ref + 1 (0 outside the
/// row, and for softmax's neighbours), and over the far keys |j − ref| > 1
/// (softmax: j ≠ ref) Σ α̃_j and the Dv sums Σ α̃_j (v_j − v_ref), α̃ = α e^{-m}.
template <class T>
struct RowStatistics {
  T* values = nullptr;
  std::conditional_t<std::is_const<T>::value, const index_t, index_t>* ref = nullptr;
  index_t width = 0;  // Dv + 5
  explicit operator bool() const { return ref != nullptr; }
  bool has(index_t row) const { return ref && ref[row] >= 0; }
  T& m(index_t row) const { return values[row * width]; }
  T* near(index_t row) const { return values + row * width + 1; }
  T& far_sum(index_t row) const { return values[row * width + 4]; }
  T* far_diff(index_t row) const { return values + row * width + 5; }
};

/// A forward score or weight tile: rows × (kBc + 1 + pad) elements of T,
/// column 0 the halo key, column 1 the tile's first key; zeros where `zero`,
/// else uninitialised (as this thread's last call left its spare block).
/// Column 1 of every row sits on a 64-byte boundary and the row stride is a
/// whole number of 64-byte lines, so that the products'
/// row stores (a 16-key block: one line in float) and the row passes' vector
/// loads and stores never split a cache line (docs/PERFORMANCE.md, "Score
/// tiles on cache lines").
template <class T>
class ScoreTile {
 public:
  ScoreTile() = default;
  ScoreTile(index_t rows, bool zero) {
    T* const buf = buf_.allocate(std::size_t(rows * kStride + kLine));
    // Elements to the first 64-byte boundary (none where no alignment is asked).
    const auto at = reinterpret_cast<std::uintptr_t>(buf);
    const std::size_t skip = kLine == 1 ? 0 : (kAlign - at % kAlign) % kAlign / sizeof(T);
    data_ = buf + skip + kLine - 1;  // column 1 on the boundary
    if (zero) std::fill_n(buf, rows * kStride + kLine, T(0));
  }
  T* row(index_t r) { return data_ + r * kStride; }
  T& operator()(index_t r, index_t c) { return data_[r * kStride + c]; }
  T* data() { return data_; }
  /// Elements from one row to the next.
  static constexpr index_t stride() { return kStride; }

 private:
  static constexpr std::size_t kAlign = 64;
  // Elements per 64-byte line (1 where T does not divide it: no alignment asked).
  static constexpr index_t kLine = kAlign % sizeof(T) == 0 ? index_t(kAlign / sizeof(T)) : 1;
  // Columns kBc + 1 + pad from column 0 at kLine − 1, in whole lines.
  static constexpr index_t kStride = (kLine - 1 + kBc + 1 + kPad<T> + kLine - 1) / kLine * kLine;
  Buffer<T> buf_;  // from this thread's spare blocks (spare_pool.hpp)
  T* data_ = nullptr;
};

template <class T>
struct ForwardWorkspace {
  RowMatrix<T> q;       // kBr × D, rows scaled by c_i
  // The key tile transposed (packed): D rows of kt_stride, a cache line more
  // than kBc. With kBc elements (2 KiB of float, 4 KiB of double) the D rows
  // of one column block of Kᵀ fall into a few of L1's 64 sets (on AVX2, one
  // line per row: two sets for float, one for double), so the score product
  // read them from L2 again for every block of query rows (docs/PERFORMANCE.md,
  // "Kᵀ's row stride").
  static constexpr index_t kt_stride = kBc + index_t(64 / sizeof(T));
  RowMatrix<T> kt;      // D × kt_stride
  // S and W of one sub-block (kBs rows; row r of the task at r mod kBs),
  // column 0 the halo key: a task's rows share them, so that they stay in L2
  // (docs/PERFORMANCE.md, "One sub-block's score and weight tiles, and each
  // thread's own heads").
  ScoreTile<T> s;       // scores; column 0 = the halo key's, from halo_s
  ScoreTile<T> w;       // weights α e^{-m} (vector tails write the pad)
  // Per row: the halo key's score in this tile (column 0 of S) and the
  // tile's last key's score, the next tile's halo.
  std::vector<T> halo_s, last_s;
  RowMatrix<T> o;       // kBr × Dv accumulators of the far keys' terms
  std::vector<T> m, l;  // running maximum; Σ α e^{-m} of the keys in o
  // A bfloat16 unit with row statistics: Σ (W̃ − W) over the keys whose
  // rounded weights W̃ went into o (on the scale of l), so that o − (l + rho)
  // v_ref is Σ W̃ (v − v_ref) (write_row).
  std::vector<T> rho;
  // The reference key (the row's first key at the maximum) and its near keys
  // ref − 1, ref, ref + 1, kept out of o and l (MATH.md §6, "row statistics
  // from the forward"): per row, near_key[3r + k] (key ref − 1 + k, −1 while it has no weight
  // here) and its α e^{-m}, near_w. A tile's last key, whose right-hand
  // segment comes with the next tile, is held back from o and l until then:
  // its left-hand weight `carry` (carry_key −1 when none).
  std::vector<index_t> ref, near_key, carry_key;
  std::vector<T> near_w, carry;
  std::vector<T> vrow;       // one value row widened to T (Dv)
  RowStatistics<T> stats{};  // where finished rows leave their statistics (none when null)
  std::vector<RowRange> range;
  std::vector<index_t> kb, ke;  // per row, the keys [kb, ke) of its P·V terms in the tile
  // A decode step's eligibility, measured as its key tiles are read
  // (forward_tiled, measure_keys): per row, the magnitudes of the keys it has
  // seen so far; per key of the tile being read, its own.
  bool measure = false;
  std::vector<KeysSeen<BoundType<T>>> keys_seen, tile_keys;
  std::vector<T> map_s, map_w;  // one row's scores and weights (inspection maps only)
  // The tile products on a bfloat16 unit (bf16_products.hpp; bfloat16
  // storage computed in float): rows rounded up to whole tiles, depth D and
  // width Dv padded to Dp, Dvp; Q's bfloat16 bits (unscaled), c_i, the packed
  // K and V tiles, W̃'s bits, which keys of the tile some row of the task
  // sees, the halo's scores, and (K, V stored as bfloat16) the halo key's
  // value row widened.
  bf16::Unit unit = bf16::Unit::none;
  bool on_unit() const { return unit != bf16::Unit::none; }
  // The stencil's accuracy: bf16 for bfloat16 storage computed in float.
  StencilAccuracy accuracy = StencilAccuracy::full;
  index_t Dp = 0, Dvp = 0;
  // The unit's operands, on 64-byte lines (spare_pool.hpp): Q's bits (nr × Dp),
  // the packed K and V tiles (kBc × Dp, kBc × Dvp), W̃ (one sub-block: kBs × kBc).
  Buffer<std::uint16_t> qb, kp, vp, wb;
  // The packed tiles the products read (kp, vp or a head cache's, below),
  // and the key steps V's tile was packed for (its layout).
  const std::uint16_t* kpt = nullptr;
  const std::uint16_t* vpt = nullptr;
  index_t vsteps = 0;
  // A head cache (pack_tile_bf16): the tiles of one (batch, KV head),
  // head_b, head_hk, packed once for this thread's tasks of that head — tile
  // t at head_kp + t·kBc·Dp and head_vp + t·kBc·Dvp; head_state[t] 0 not
  // packed yet, 1 packed, 2 packed per task (a NaN or an Inf in it). Empty
  // when the call does not ask for one.
  Buffer<std::uint16_t> head_kp, head_vp;
  std::vector<char> head_state;
  index_t head_b = -1, head_hk = -1;
  std::vector<T> c, halo, vhalo;
  const T* vh = nullptr;  // the value row of the tile's halo key, in T
  std::vector<char> seen;
  std::vector<int> cover;
  // Values stored in another type than T (Stored<S>): the value rows of
  // the halo key and the tile, (kBc + 1) × Dv, widened to T (the key tile is
  // widened where it is transposed into kt).
  std::vector<T> vstage;
  /// rows: the most query rows of one task (≤ kBr; a decode step has a few);
  /// stage: keys and values stored in another type than T; head_keys: the
  /// keys of a head for a head cache (a unit only; 0: none).
  ForwardWorkspace(index_t D, index_t Dv, index_t rows, bf16::Unit on = bf16::Unit::none, bool stage = false,
                   index_t head_keys = 0)
      : q(rows, D), kt(D, kt_stride), m(rows), l(rows), rho(rows), ref(rows), near_key(std::size_t(3 * rows)), carry_key(rows),
        near_w(std::size_t(3 * rows)), carry(rows), halo_s(rows), last_s(rows), range(rows), kb(rows), ke(rows),
        unit(on) {
    vrow.resize(std::size_t(Dv));
    keys_seen.resize(std::size_t(rows));
    if (stage && !on_unit()) vstage.resize(std::size_t((kBc + 1) * Dv));
    if (stage && on_unit()) vhalo.resize(std::size_t(Dv));
    const index_t nr = on_unit() ? round_up(rows, bf16::kRows) : rows;
    const index_t sub = std::min(nr, kBs);  // a sub-block's rows (kBs: whole 16-row blocks)
    s = ScoreTile<T>(sub, true);
    w = ScoreTile<T>(sub, false);
    if (on_unit()) {
      Dp = round_up(D, bf16::kStep);
      Dvp = round_up(Dv, bf16::kCols);
      const auto zeroed = [](Buffer<std::uint16_t>& buf, index_t n) {
        std::fill_n(buf.allocate(std::size_t(n)), n, std::uint16_t(0));
      };
      zeroed(qb, nr * Dp);
      zeroed(kp, kBc * Dp);
      zeroed(vp, kBc * Dvp);
      zeroed(wb, sub * kBc);
      c.resize(std::size_t(nr));
      halo.resize(std::size_t(nr * bf16::kCols));
      seen.resize(std::size_t(kBc));
      cover.resize(std::size_t(kBc + 1));
      if (head_keys > 0) {
        const index_t tiles = (head_keys + kBc - 1) / kBc;
        head_kp.allocate(std::size_t(tiles * kBc * Dp));
        head_vp.allocate(std::size_t(tiles * kBc * Dvp));
        head_state.assign(std::size_t(tiles), char(0));
      }
    }
    o.resize(nr, on_unit() ? Dvp : Dv);
  }
};

/// The tensors of a forward as the caller stores them: Q, K and V read and
/// the output written, in storage type S — the call's own (S = T), or a
/// 16-bit call computed in float (S = bfloat16 or float16, T = float), read
/// and written without a copy of the whole tensor: each query row is widened
/// where it is scaled, each key tile's rows where the tile is packed (a KV
/// cache is never copied), exactly, so the products see the same floats as
/// from a widened copy; each output row is rounded once where it is
/// finished. (The forward's ForwardArgs<T> then give only their shapes, lse,
/// maps and options.)
template <class S>
struct Stored {
  TensorView<const S> query, key, value;
  TensorView<S> out;
};

/// The key tile [k0, k0 + nc) of (b, hk) transposed into ws.kt (row stride
/// kt_stride, zeros past nc; 16-bit keys widened in registers on the way) unless the
/// scores transpose it themselves (few_row_scores); and, for values stored in
/// S ≠ T, the value rows [max(k0 − 1, 0), k0 + nc) widened into ws.vstage
/// (row k at k − (k0 − 1)).
template <class T, class S>
void pack_tile(const Stored<S>& io, index_t b, index_t hk, index_t k0, index_t nc, bool keys,
               ForwardWorkspace<T>& ws) {
  const index_t D = io.key.dim, Dv = io.value.dim;
  if (keys) pack_transposed(io.key.row(b, hk, k0), io.key.stride_seq, nc, D, ws.kt.data(), ws.kt_stride);
  if constexpr (!std::is_same<S, T>::value) {
    for (index_t k = std::max<index_t>(k0 - 1, 0); k < k0 + nc; ++k)
      convert_n(io.value.row(b, hk, k), ws.vstage.data() + (k - (k0 - 1)) * Dv, Dv);
  }
}

/// The inspection maps of one finished row (small inputs; MATH.md §5), each
/// Lk entries, zero outside the visible keys [lo, hi): P_j = α_j / Z, the
/// kernel's own stencil weights taken over the whole visible range at once
/// (on a bfloat16 unit the scores here are the vector path's (c q)·k, which agree with the
/// tiles' c ⊗ (q·k) to float rounding, not bit for bit),
/// and π_j = the half-token cell mass / Z. qs is the row's query scaled by c,
/// m and l its final maximum and Σ α e^{-m}.
template <class T, class Stencil, class S>
void write_maps(const T* qs, const TensorView<const S>& key, index_t b, index_t hk, RowRange rg, T m, T l, T* prow,
                T* mrow, ForwardWorkspace<T>& ws) {
  const index_t Lk = key.seq, D = key.dim, lo = rg.lo, hi = rg.hi;
  if (prow) std::fill(prow, prow + Lk, T(0));
  if (mrow) std::fill(mrow, mrow + Lk, T(0));
  if (hi <= lo || !(l > T(0))) return;
  ws.map_s.assign(std::size_t(Lk + 2 * kPad<T>), T(0));
  ws.map_w.assign(std::size_t(Lk + 2 * kPad<T>), T(0));
  T* sb = ws.map_s.data();
  T* wb = ws.map_w.data();
  for (index_t j = lo; j < hi; ++j) {  // the tile product's operations: a running multiply-add in d order
    const S* kj = key.row(b, hk, j);
    T acc = T(0);
    for (index_t d = 0; d < D; ++d) acc = madd(qs[d], T(kj[d]), acc);
    sb[j] = acc;
  }
  if constexpr (Stencil::has_halo)
    with_accuracy<T>(ws.accuracy, [&](auto acc) {
      return row_continuum_weights<T, decltype(acc)::value>(sb, m, wb, lo, hi, true, true);
    });
  else
    row_exp_sum(sb, m, wb, lo, hi);
  if (prow)
    for (index_t j = lo; j < hi; ++j) prow[j] = wb[j] / l;
  if (mrow) {
    using F = detail::FlushedStencil<Stencil, double>;
    for (index_t j = lo; j < hi; ++j) {
      const bool hl = j - 1 >= lo, hr = j + 1 < hi;
      const double x = double(sb[j] - m), xl = hl ? double(sb[j - 1] - m) : 0.0, xr = hr ? double(sb[j + 1] - m) : 0.0;
      mrow[j] = T(F::cell_mass(xl, x, xr, hl, hr)) / l;
    }
  }
}

/// c_i = scale / τ_i of row (b, h, i), formed in T.
template <class T>
inline T query_scale(const ForwardArgs<T>& a, index_t b, index_t h, index_t i, double scale) {
  return T(MeasureType<T>(scale) /
           MeasureType<T>(temperature_at(a.temperature, b, h, i, a.query.heads, a.query.seq)));
}

/// qs = c_i q_i, the query of row (b, h, i) (read from `query`, stored in
/// S) scaled by c_i = scale / τ_i; returns c_i.
template <class T, class S>
inline T scaled_query(const ForwardArgs<T>& a, const TensorView<const S>& query, index_t b, index_t h, index_t i,
                      double scale, T* qs) {
  const T c = query_scale(a, b, h, i, scale);
  const S* qi = query.row(b, h, i);
  for (index_t d = 0; d < query.dim; ++d) qs[d] = c * T(qi[d]);
  return c;
}

/// Writes the outputs of finished row r of a task (query i of head h, batch
/// b): out = o / l, lse = m + log l (0 and −∞ for a row that sees no key) and
/// the inspection maps when asked for (from the keys io.key).
template <class T, class Stencil, class S>
void write_row(const ForwardArgs<T>& a, const Stored<S>& io, index_t b, index_t h, index_t i, index_t r,
               ForwardWorkspace<T>& ws) {
  const index_t Lq = a.query.seq, Lk = a.key.seq, Dv = a.value.dim, Hq = a.query.heads;
  const index_t hk = h / (Hq / a.key.heads);
  T* o = ws.o.row(r).data();
  const index_t* near_key = ws.near_key.data() + 3 * r;
  const T* near_w = ws.near_w.data() + 3 * r;
  const index_t row = (b * Hq + h) * Lq + i;
  if (ws.stats && ws.ref[r] >= 0) {
    const RowStatistics<T>& st = ws.stats;
    const index_t ref = ws.ref[r];
    st.m(row) = ws.m[r];
    st.ref[row] = ref;
    for (index_t k = 0; k < 3; ++k) st.near(row)[k] = near_w[k];
    st.far_sum(row) = ws.l[r];
    const S* vr = io.value.row(b, hk, ref);
    T* u = st.far_diff(row);
    const T lw = ws.l[r] + ws.rho[r];  // the weights o holds (W̃ where rounded)
    for (index_t d = 0; d < Dv; ++d) u[d] = madd(-lw, T(vr[d]), o[d]);
    // A unit: o's zero sign is not the row's own (below); neither is u's where v_ref[d] = 0.
    if (ws.on_unit())
      for (index_t d = 0; d < Dv; ++d) u[d] = unsigned_zero(u[d]);
  }
  // Z̃ and o: the far keys' sums, then the near keys' terms.
  T z = ws.l[r];
  for (index_t k = 0; k < 3; ++k)
    if (near_key[k] >= 0) {
      add_scaled(o, near_w[k], io.value.row(b, hk, near_key[k]), Dv, ws.vrow.data());
      z += near_w[k];
    }
  ws.l[r] = z;
  const bool empty = !(z > T(0));
  // The row in T: the caller's; stored in S ≠ T, ws.vrow, then rounded once into the caller's.
  T* out = ws.vrow.data();
  if constexpr (std::is_same<S, T>::value) out = io.out.row(b, h, i);
  const T inv = empty ? T(0) : T(1) / z;
  // A bfloat16 unit: an accumulator can be −0 (a tiny negative sum flushed to
  // zero by the unit), and the 0 · v of a key that only other rows of the task
  // see would then decide its sign (unsigned_zero).
  for (index_t d = 0; d < Dv; ++d) {
    T x = empty ? T(0) : o[d] * inv;
    if (ws.on_unit()) x = unsigned_zero(x);
    out[d] = x;
  }
  if constexpr (!std::is_same<S, T>::value) convert_n(out, io.out.row(b, h, i), Dv);
  if (a.lse) a.lse[(b * Hq + h) * Lq + i] = empty ? -std::numeric_limits<T>::infinity() : ws.m[r] + std::log(ws.l[r]);
  if (a.probs || a.cell_mass) {
    write_maps<T, Stencil>(ws.q.row(r).data(), io.key, b, hk, ws.range[r], ws.m[r], ws.l[r],
                           a.probs ? a.probs + row * Lk : nullptr, a.cell_mass ? a.cell_mass + row * Lk : nullptr, ws);
  }
}

// The bfloat16-unit steps of forward_block (bf16_products.hpp); kBf16<T>: T
// is float and this translation unit has the units' kernels. Each is a no-op
// elsewhere (ws.unit is then never set). Q, K and V are read from io: a's
// own (floats holding bfloat16 values) or bfloat16 as stored (a KV cache is
// never widened as a whole).
#if defined(CONTINUUM_CPU_AVX512BF16)
template <class T>
inline constexpr bool kBf16 = std::is_same<T, float>::value;
#else
template <class T>
inline constexpr bool kBf16 = false;
#endif

/// Which keys of the tile [k0, k0 + nc) some row sees, for a unit's packing
/// (keys no row sees are packed as zeros, never loaded): add_cover marks the
/// n row ranges in cover (nc + 1 ints, zeroed by the caller: +1 where a range
/// starts, −1 where it ends), seen_from_cover sets seen[j] = whether key
/// k0 + j is in one of them.
inline void add_cover(const RowRange* range, index_t n, index_t k0, index_t nc, int* cover) {
  for (index_t r = 0; r < n; ++r) {
    const index_t lo = std::max(range[r].lo, k0) - k0, hi = std::min(range[r].hi, k0 + nc) - k0;
    if (lo < hi) ++cover[lo], --cover[hi];
  }
}
inline void seen_from_cover(const int* cover, index_t nc, char* seen) {
  int run = 0;
  for (index_t j = 0; j < nc; ++j) seen[j] = char((run += cover[j]) > 0);
}

/// Whether no element of a packed tile is a NaN or an Inf (bfloat16 bits:
/// exponent all ones, the largest magnitudes' bits).
inline bool packed_finite(const std::uint16_t* p, index_t n) {
  std::uint16_t top = 0;
  for (index_t i = 0; i < n; ++i) top = std::max(top, std::uint16_t(p[i] & 0x7fffu));
  return top < 0x7f80u;
}

/// Points ws.kpt and ws.vpt at the key and value tile [k0, k0 + nc) packed
/// for the unit's products, and ws.vh at the value row of key k0 − 1 in
/// float (the halo's P·V term). With a head cache (ws.head_state) the tile is
/// the thread's copy of the whole tile [k0, min(k0 + kBc, Lk)), packed once
/// for all its tasks of that head when every element of it is finite: keys
/// some rows of a task do not see then add 0 · v to their sums (exactly
/// nothing: v is finite; a zero's sign aside, which write_row does not keep)
/// and their scores are never read. Else the task's own: keys that no row of
/// the task sees are zeros, their data never loaded (a NaN or an Inf there,
/// seen by rows of other tasks only, must not reach these rows' 0 · v).
/// A measuring task (ws.measure) has not yet dropped the rows it will not
/// write, so it packs as zeros the keys [u0, u1) that measure_keys found
/// holding a NaN or an Inf: every row that sees one is NaN in the end, and
/// the others' 0 · v stays exactly 0.
template <class T, class S>
void pack_tile_bf16(const Stored<S>& io, index_t b, index_t hk, index_t k0, index_t nc, index_t nr, index_t ncp,
                    ForwardWorkspace<T>& ws, index_t u0 = 0, index_t u1 = 0) {
  if constexpr (kBf16<T>) {
    const index_t D = io.key.dim, Dv = io.value.dim;
    bool cached = false;
    if (!ws.head_state.empty()) {
      if (b != ws.head_b || hk != ws.head_hk) {
        std::fill(ws.head_state.begin(), ws.head_state.end(), char(0));
        ws.head_b = b;
        ws.head_hk = hk;
      }
      const index_t t = k0 / kBc, n = std::min(kBc, io.key.seq - k0);
      const index_t kb = round_up(n, bf16::kCols) / bf16::kCols, steps = round_up(n, bf16::kStep) / bf16::kStep;
      std::uint16_t* kp = ws.head_kp.data() + t * kBc * ws.Dp;
      std::uint16_t* vp = ws.head_vp.data() + t * kBc * ws.Dvp;
      char& state = ws.head_state[std::size_t(t)];
      if (state == 0) {
        std::fill(ws.seen.begin(), ws.seen.begin() + n, char(1));
        bf16::pack_keys(io.key.row(b, hk, k0), io.key.stride_seq, n, D, ws.Dp, ws.seen.data(), kb, kp);
        bf16::pack_values(io.value.row(b, hk, k0), io.value.stride_seq, n, Dv, ws.Dvp, ws.seen.data(), steps, vp);
        state = packed_finite(kp, kb * bf16::kCols * ws.Dp) && packed_finite(vp, steps * bf16::kStep * ws.Dvp)
                    ? 1 : 2;
      }
      if (state == 1) {
        ws.kpt = kp;
        ws.vpt = vp;
        ws.vsteps = steps;
        cached = true;
      }
    }
    if (!cached) {
      std::fill(ws.cover.begin(), ws.cover.begin() + nc + 1, 0);
      add_cover(ws.range.data(), nr, k0, nc, ws.cover.data());
      seen_from_cover(ws.cover.data(), nc, ws.seen.data());
      if (ws.measure)
        for (index_t j = u0; j < u1; ++j)
          if (ws.tile_keys[std::size_t(j - u0)].bad) ws.seen[std::size_t(j - k0)] = 0;
      bf16::pack_keys(io.key.row(b, hk, k0), io.key.stride_seq, nc, D, ws.Dp, ws.seen.data(), ncp / bf16::kCols,
                      ws.kp.data());
      ws.vsteps = round_up(nc, bf16::kStep) / bf16::kStep;
      bf16::pack_values(io.value.row(b, hk, k0), io.value.stride_seq, nc, Dv, ws.Dvp, ws.seen.data(), ws.vsteps,
                        ws.vp.data());
      ws.kpt = ws.kp.data();
      ws.vpt = ws.vp.data();
    }
    ws.vh = nullptr;
    if (k0 > 0) {
      const S* v = io.value.row(b, hk, k0 - 1);
      if constexpr (std::is_same<S, T>::value) {
        ws.vh = v;
      } else {
        convert_n(v, ws.vhalo.data(), io.value.dim);
        ws.vh = ws.vhalo.data();
      }
    }
  }
}

/// S_raw of rows [g0, g1) (whole 16-row blocks; nr rows in all; the
/// sub-block's first, g0, at row 0 of the score tile) for the tile keys
/// [j0, j1) (multiples of 16), into the score tile's columns 1 + j.
template <class T>
void scores_bf16(index_t g0, index_t g1, index_t nr, index_t j0, index_t j1, ForwardWorkspace<T>& ws) {
  if constexpr (kBf16<T>) {
    const index_t lds = ws.s.stride();
    if (g0 < std::min(g1, nr))
      bf16::scores(ws.unit, ws.qb.data() + g0 * ws.Dp, ws.Dp, ws.Dp, ws.kpt, j0 / bf16::kCols,
                   (j1 + bf16::kCols - 1) / bf16::kCols, ws.s.data() + 1 + j0, lds, std::min(g1, nr) - g0);
  }
}

/// Row r's weights W (tile columns [ce0, cv1); row lr of the sub-block's W)
/// as W̃ = bfloat16(W) for the P·V product, in row lr of ws.wb: its n_cols
/// columns (the tile's keys, a multiple of kStep), 0 where the row sees no
/// key. The halo key's term (column 0, the previous tile's last key, value
/// row ws.vh) goes into the accumulators first, in float. With row
/// statistics, Σ (W̃ − W) of the row's terms goes to ws.rho. (A weight below
/// 2^-126 is converted to 0: its term, below 2^-126·|v|, is left out of O and
/// enters ρ as −W; the rows the unit takes are those where such flushes are
/// negligible, row_eligibility.)
template <class T>
void weights_bf16(index_t Dv, index_t ce0, index_t cv1, index_t r, index_t lr, index_t n_cols,
                  ForwardWorkspace<T>& ws) {
  if constexpr (kBf16<T>) {
    const T* wr = ws.w.row(lr);
    if (ce0 == 0) {
      const T w0 = bf16::round_bf16(wr[0]);
      T* orow = ws.o.row(r).data();
      for (index_t d = 0; d < Dv; ++d) orow[d] = madd(w0, ws.vh[d], orow[d]);
      if (ws.stats) ws.rho[r] += w0 - wr[0];
    }
    // Column cc ≥ 1 of the score tile is key cc − 1 of the tile.
    const index_t c0 = std::max<index_t>(ce0, 1);
    bf16::round_row<false>(wr + 1, c0 - 1, cv1 - 1, n_cols, ws.wb.data() + lr * kBc, ws.stats ? &ws.rho[r] : nullptr);
  }
}

/// Softmax's (and focal's) weights of row r on a unit, from the tile's raw
/// scores (sr: S_raw, not scaled in place; m from c_i ⊗ max S_raw): W = e^{c_i ⊗
/// s − m} of the columns [cv0, cv1) but `skip`, to bfloat16's accuracy (the
/// weights are rounded to bfloat16 for P·V: VectorOps::exp_bf16, MATH.md §10,
/// "bfloat16 products"), rounded to W̃ into row lr of ws.wb (its n_cols columns,
/// 0 where the row sees no key) and summed in the same pass (bf16::round_row),
/// Σ (W̃ − W) into ws.rho with row statistics. skip (−1: none) is the
/// reference key's column, whose term is held apart (near_w). Returns Σ W.
template <class T>
T softmax_weights_bf16(const T* sr, index_t cv0, index_t cv1, index_t skip, index_t r, index_t lr, index_t n_cols,
                       T m, ForwardWorkspace<T>& ws) {
  T sum = T(0);
#if defined(CONTINUUM_CPU_AVX512BF16)
  if constexpr (kBf16<T>) {
    using V = Simd<float>::v;
    const T c = ws.c[std::size_t(r)];
    // Column cc ≥ 1 of the score tile is key cc − 1 of the tile.
    bf16::round_row<false>(
        sr + 1, cv0 - 1, cv1 - 1, n_cols, ws.wb.data() + lr * kBc, ws.stats ? &ws.rho[r] : nullptr,
        [&](__m512 y) { return (__m512)VectorOps<float>::exp_bf16((V)y * c - m); },
        &sum, skip - 1);
  }
#else
  (void)sr, (void)cv0, (void)cv1, (void)skip, (void)r, (void)lr, (void)n_cols, (void)m, (void)ws;
#endif
  return sum;
}

/// O += W̃ · V for rows [g0, g1) (whole 16-row blocks; nr rows in all; the
/// sub-block's first, g0, at row 0 of W̃) over the tile's first `steps` key
/// steps.
template <class T>
void accumulate_bf16(index_t g0, index_t g1, index_t nr, index_t steps, ForwardWorkspace<T>& ws) {
  if constexpr (kBf16<T>) {
    const index_t ldo = ws.o.cols();
    if (g0 < std::min(g1, nr))
      bf16::accumulate(ws.unit, ws.wb.data(), kBc, ws.vsteps, ws.vpt, ws.Dvp, ws.o.data() + g0 * ldo, ldo,
                       std::min(g1, nr) - g0, steps);
  }
}

/// The halo score (key k0 − 1) of the first tile of a chunk, on the unit as
/// the previous chunk's last tile computes it: key k0 − 1 alone in a block of
/// 16 (per-element products: the other columns do not matter).
template <class T, class S>
void chunk_halo_bf16(const Stored<S>& io, index_t b, index_t hk, index_t k0, index_t nr, ForwardWorkspace<T>& ws) {
  if constexpr (kBf16<T>) {
    bool needed = false;  // key k0 − 1 is loaded only when a row sees it
    for (index_t r = 0; r < nr; ++r) needed |= ws.range[r].lo < k0 && ws.range[r].hi > k0;
    if (!needed) {
      for (index_t r = 0; r < nr; ++r) ws.halo_s[std::size_t(r)] = T(0);
      return;
    }
    std::fill(ws.seen.begin(), ws.seen.begin() + bf16::kCols, char(0));
    ws.seen[bf16::kCols - 1] = 1;
    bf16::pack_keys(io.key.row(b, hk, k0 - bf16::kCols), io.key.stride_seq, bf16::kCols, io.key.dim, ws.Dp,
                    ws.seen.data(), 1, ws.kp.data());
    bf16::scores(ws.unit, ws.qb.data(), ws.Dp, ws.Dp, ws.kp.data(), 0, 1, ws.halo.data(), bf16::kCols, nr);
    for (index_t r = 0; r < nr; ++r)
      ws.halo_s[std::size_t(r)] = ws.range[r].lo < k0 && ws.range[r].hi > k0
                                      ? ws.c[std::size_t(r)] * ws.halo[std::size_t(r * bf16::kCols + bf16::kCols - 1)]
                                      : T(0);
  }
}

/// Keys ref − kNear … ref + kNear are the reference key's near keys: its
/// neighbours on the curve (continuum), or itself alone (softmax).
template <class Stencil>
inline constexpr index_t kNear = Stencil::has_halo ? 1 : 0;

/// Row r's reference key becomes `ref` (the first key of a new maximum, in
/// the current tile): the near keys of the old one that are not near the new
/// one are far keys now, and their terms join o and l.
template <class Stencil, class T, class S>
void move_reference(const Stored<S>& io, index_t b, index_t hk, index_t r, index_t ref, ForwardWorkspace<T>& ws) {
  index_t* key = ws.near_key.data() + 3 * r;
  T* w = ws.near_w.data() + 3 * r;
  const index_t old_key[3] = {key[0], key[1], key[2]};
  const T old_w[3] = {w[0], w[1], w[2]};
  for (index_t k = 0; k < 3; ++k) {
    key[k] = -1;
    w[k] = T(0);
  }
  ws.ref[r] = ref;
  for (index_t k = 0; k < 3; ++k) {
    const index_t j = old_key[k];
    if (j < 0) continue;
    if (j >= ref - kNear<Stencil> && j <= ref + kNear<Stencil>) {
      key[j - ref + 1] = j;
      w[j - ref + 1] = old_w[k];
    } else {
      add_scaled(ws.o.row(r).data(), old_w[k], io.value.row(b, hk, j), io.value.dim, ws.vrow.data());
      ws.l[r] += old_w[k];
    }
  }
}

/// Takes the terms of row r's near keys that this tile settles — columns
/// [c0, c1) of its weights w, key key0 + c at column c, inside the row's
/// range [lo, hi) — out of w (set to 0) into near_w. Returns the sum of what
/// it took (−1 when nothing).
template <class Stencil, class T>
T take_near_keys(index_t r, T* w, index_t key0, index_t c0, index_t c1, index_t lo, index_t hi,
                 ForwardWorkspace<T>& ws) {
  const index_t ref = ws.ref[r];
  T took = T(-1);
  if (ref < 0) return took;
  for (index_t j = std::max(ref - kNear<Stencil>, lo); j <= ref + kNear<Stencil> && j < hi; ++j) {
    const index_t c = j - key0;
    if (c < c0 || c >= c1) continue;
    const std::size_t k = std::size_t(3 * r + (j - ref + 1));
    ws.near_key[k] = j;
    ws.near_w[k] += w[c];
    took = (took < T(0) ? T(0) : took) + w[c];
    w[c] = T(0);
  }
  return took;
}

/// A decode step's eligibility (ws.measure; forward_tiled), measured where it
/// reads a key tile: the magnitudes of the keys [u0, u1) of the tile [k0, k1)
/// that the task's rows r0 … r1 − 1 see (row_norm2, as KeyMagnitudes), and each
/// row's maxima over its own visible keys among them, into ws.keys_seen. Reading
/// the K and V rows here brings them into the cache for the tile's products;
/// as a pass of its own (row_eligibility) it read the whole KV cache once more
/// (docs/PERFORMANCE.md, "A decode step's eligibility, measured as it reads
/// its keys").
template <class T, class S>
void measure_keys(const Stored<S>& io, index_t b, index_t hk, index_t k0, index_t k1, index_t r0, index_t r1,
                  index_t u0, index_t u1, ForwardWorkspace<T>& ws) {
  using A = BoundType<T>;
  KeysSeen<A> all;
  for (index_t j = u0; j < u1; ++j) {
    bool kb, vb;
    KeysSeen<A>& t = ws.tile_keys[std::size_t(j - u0)];
    t.kn = row_norm2<A>(io.key.row(b, hk, j), io.key.dim, kb);
    t.vn = row_norm2<A>(io.value.row(b, hk, j), io.value.dim, vb);
    t.bad = char(kb || vb);
    all.take(t);
  }
  for (index_t r = r0; r < r1; ++r) {
    const index_t vlo = std::max(ws.range[r].lo, k0), vhi = std::min(ws.range[r].hi, k1);
    if (vlo >= vhi) continue;
    if (vlo == u0 && vhi == u1) {  // (a decode step's rows mostly see the same keys)
      ws.keys_seen[std::size_t(r)].take(all);
      continue;
    }
    KeysSeen<A> mine;
    for (index_t j = vlo; j < vhi; ++j) mine.take(ws.tile_keys[std::size_t(j - u0)]);
    ws.keys_seen[std::size_t(r)].take(mine);
  }
}

/// Whether measured row (b, h, i) is the tiled kernel's (ws.measure): its
/// state from the keys it saw (row_state, as row_eligibility would have
/// given it), left in ok; a row outside the subset or seeing no key stays.
/// unit: the task's products ran on a bfloat16 unit (row_state's
/// unscaled_scores: the unit's q·k and its flushes are checked too).
template <class T, class S>
bool measured_row_tiled(const ForwardArgs<T>& a, const Stored<S>& io, index_t b, index_t h, index_t i,
                        double scale, const KeysSeen<BoundType<T>>& seen, char* ok, bool unit) {
  const index_t Hq = a.query.heads, Lq = a.query.seq;
  char& state = ok[std::size_t((b * Hq + h) * Lq + i)];
  const KeyRange rg = visible_range(a.visibility, b, i, Lq, a.key.seq);
  if (state != kTiled || rg.empty()) return state == kTiled;
  state = row_state<T>(io.query, a.value.dim, nullptr, a.temperature, scale, b, h, i, Hq / a.key.heads, rg, seen,
                       unit);
  return state == kTiled;
}

/// One task: the query rows [i0, i1) of the nh query heads h0 … h0 + nh − 1 of
/// batch b, which share one KV head (nh = 1, or the whole GQA group when a
/// task can hold it: a decode step), so that each key tile is packed once for
/// all of them. Row r is query i0 + r mod (i1 − i0) of head h0 + r div
/// (i1 − i0). Stencil is the stencil policy (ContinuumStencil's three-point
/// stencil or SoftmaxStencil's e^s). Each row's operations do not depend on
/// which rows share its task (range_gemm, per-element tile products), so
/// grouping changes no bit. The task covers the keys [ka, kz) (a chunk of a
/// split task, multiples of kBc; else [0, Lk)): with `partial` null its rows
/// are finished and written, else their state (m, l, o) goes to
/// partial[r · (Dv + 2) + …] (finish_split). The queries, keys and values
/// are read from io (Stored), by the bfloat16 unit's steps too, and the
/// outputs written there. ok: the rows' states (null: every row kTiled;
/// never null with ws.measure, where the rows' eligibility is measured here,
/// measure_keys): a finished row that the kernel in T does not take gets its
/// state in ok and is not written; a chunk's rows leave what they saw in
/// seen[r].
template <class T, class Stencil, class S>
void forward_block(const ForwardArgs<T>& a, const Stored<S>& io, index_t b, index_t h0, index_t nh, index_t i0,
                   index_t i1, double scale, ForwardWorkspace<T>& ws, char* ok, index_t ka, index_t kz,
                   T* partial, KeysSeen<BoundType<T>>* seen = nullptr) {
  constexpr bool staged = !std::is_same<S, T>::value;  // each tile's K, V rows widened into ws (pack_tile)
  const index_t Lq = a.query.seq, Lk = a.key.seq, D = a.query.dim, Dv = a.value.dim;
  const index_t Hq = a.query.heads;
  const index_t hk = h0 / (Hq / a.key.heads);
  const index_t ni = i1 - i0, nr = nh * ni;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();

  index_t kmin = Lk, kmax = 0;
  for (index_t r = 0; r < nr; ++r) {
    const index_t i = i0 + r % ni, h = h0 + r / ni;
    ws.range[r] = row_range(a.visibility, b, i, Lq, Lk);
    // A row the tiled kernel does not take (row_eligibility) is computed
    // here as empty and written by the caller's `declined` afterwards. (With
    // ws.measure its state is known only at the end: it is computed, then
    // not written.)
    if (ok && ok[(b * Hq + h) * Lq + i] != kTiled) ws.range[r] = {0, 0};
    if (ws.range[r].hi > ws.range[r].lo) {
      kmin = std::min(kmin, ws.range[r].lo);
      kmax = std::max(kmax, ws.range[r].hi);
    }
    // A unit multiplies the query as stored (ws.qb); c_i q_i in T is read only
    // by the inspection maps there.
    const T c = ws.on_unit() && !a.probs && !a.cell_mass ? query_scale(a, b, h, i, scale)
                                                        : scaled_query(a, io.query, b, h, i, scale, ws.q.row(r).data());
    if constexpr (kBf16<T>)
      if (ws.on_unit()) {
        ws.c[std::size_t(r)] = c;
        const S* qi = io.query.row(b, h, i);
        std::uint16_t* qb = ws.qb.data() + r * ws.Dp;
        for (index_t d = 0; d < D; ++d) qb[d] = bf16::bits_exact(qi[d]);
      }
    ws.m[r] = kNegInf;
    ws.l[r] = ws.rho[r] = T(0);
    ws.keys_seen[std::size_t(r)] = {};
    ws.ref[r] = ws.carry_key[r] = -1;
    ws.carry[r] = T(0);
    for (index_t k = 0; k < 3; ++k) {
      ws.near_key[std::size_t(3 * r + k)] = -1;
      ws.near_w[std::size_t(3 * r + k)] = T(0);
    }
  }
  // A bfloat16 unit: the rows of the last tile past nr hold zeros (weights,
  // below) and no scores that are read; each row's products involve its own
  // row only.
  const index_t nr_tiles = ws.on_unit() ? round_up(nr, bf16::kRows) : nr;
  ws.o.topRows(nr_tiles).setZero();
  kmin = std::max(kmin, ka);  // this task's chunk of keys
  kmax = std::min(kmax, kz);

  const index_t ldv = io.value.stride_seq;
  const index_t lds = ws.s.stride(), ldw = ws.w.stride();
  // Key tiles sit at multiples of kBc, whatever the block: a row is computed
  // with the same tiles (the same operations) in any query block, so a
  // KV-cache decode step reproduces the full forward's row bit for bit.
  const index_t kstart = kmin / kBc * kBc;
  // A decode step's few rows (up to the micro-kernel's row block) multiply
  // each key tile as they transpose it (few_row_scores): the same scores.
#if defined(CONTINUUM_TILE_GEMM)
  const bool few_rows = kVector<T> && !ws.on_unit() && nr <= kMR;
#else
  constexpr bool few_rows = false;
#endif
  for (index_t k0 = kstart; k0 < kmax; k0 += kBc) {
    const index_t k1 = std::min(k0 + kBc, kmax);
    const index_t nc = k1 - k0;
    const index_t key0 = k0 - 1;  // tile column c holds key key0 + c; column 0 is the halo
    // Halo: the previous tile's last score (last_s); in the first tile, 0
    // where no row can see key k0 - 1, except at the start of a chunk, where
    // the rows that see it get its score (the tile product's operations: a
    // running multiply-add in d order).
    for (index_t r = 0; r < nr; ++r) ws.halo_s[std::size_t(r)] = k0 > kstart ? ws.last_s[std::size_t(r)] : T(0);
    if (k0 == kstart && k0 == ka && k0 > 0 && ws.on_unit())
      chunk_halo_bf16(io, b, hk, k0, nr, ws);
    else if (k0 == kstart && k0 == ka && k0 > 0)
      for (index_t r = 0; r < nr; ++r)
        if (ws.range[r].lo < k0 && ws.range[r].hi > k0) {
          const T* qs = ws.q.row(r).data();
          const S* kh = io.key.row(b, hk, k0 - 1);
          T acc = T(0);
          for (index_t d = 0; d < D; ++d) acc = madd(qs[d], T(kh[d]), acc);
          ws.halo_s[std::size_t(r)] = acc;
        }
    bool packed = false;
    index_t ncp = 0;
    for (index_t r0 = 0; r0 < nr; r0 += kBs) {
      const index_t r1 = std::min(nr, r0 + kBs);
      // Keys of this tile that some row of the sub-block sees: [u0, u1).
      index_t u0 = k1, u1 = k0;
      for (index_t r = r0; r < r1; ++r) {
        const index_t vlo = std::max(ws.range[r].lo, k0), vhi = std::min(ws.range[r].hi, k1);
        if (vlo < vhi) {
          u0 = std::min(u0, vlo);
          u1 = std::max(u1, vhi);
        }
      }
      if (u0 >= u1) continue;  // the whole sub-block is blind to this tile: skipped
      if (ws.measure) measure_keys(io, b, hk, k0, k1, r0, r1, u0, u1, ws);
      if (!packed) {
        // Kᵀ of the whole tile, padded with zero keys to the vector width
        // (a bfloat16 unit: K and V packed, keys no row of the task sees as zeros).
        ncp = std::min(round_up(nc, kPad<T>), kBc);
        if (ws.on_unit())
          pack_tile_bf16(io, b, hk, k0, nc, nr, ncp, ws, u0, u1);
        else
          pack_tile(io, b, hk, k0, nc, !few_rows, ws);
        packed = true;
      }
      // S[r0:r1, 1 + j] = Qs · K_tileᵀ for the tile keys j in [j0, j1) ⊇ [u0 - k0, u1 - k0).
      const index_t j0 = (u0 - k0) / kPad<T> * kPad<T>;
      const index_t j1 = std::min(round_up(u1 - k0, kPad<T>), ncp);
      // A unit: the columns of W̃ and the key steps of P·V up to the last key
      // the sub-block sees (those past it would add 0 · v: under a causal mask
      // all but the last sub-block of a task stop short of the tile's end).
      const index_t n_cols = round_up(u1 - k0, bf16::kStep);
      if (ws.on_unit()) {
        scores_bf16(r0, std::min(r1, nr_tiles), nr, j0, j1, ws);
        // The rows of the last 16-row block past nr: zero weights (W̃'s rows
        // are the sub-block's, reused).
        if (r1 == nr && nr_tiles > nr)
          std::fill(ws.wb.data() + (nr - r0) * kBc, ws.wb.data() + (nr_tiles - r0) * kBc, std::uint16_t(0));
      } else if (few_rows) {
#if defined(CONTINUUM_TILE_GEMM)
        if constexpr (kVector<T>) {
          const T* q = ws.q.data() + r0 * D;
          const S* key = io.key.row(b, hk, k0);
          const index_t ldk = io.key.stride_seq;
          T* sr = ws.s.data() + 1;
          switch (r1 - r0) {
            case 6: few_row_scores<6>(q, D, key, ldk, nc, D, j0, j1, sr, lds); break;
            case 5: few_row_scores<5>(q, D, key, ldk, nc, D, j0, j1, sr, lds); break;
            case 4: few_row_scores<4>(q, D, key, ldk, nc, D, j0, j1, sr, lds); break;
            case 3: few_row_scores<3>(q, D, key, ldk, nc, D, j0, j1, sr, lds); break;
            case 2: few_row_scores<2>(q, D, key, ldk, nc, D, j0, j1, sr, lds); break;
            default: few_row_scores<1>(q, D, key, ldk, nc, D, j0, j1, sr, lds); break;
          }
        }
#endif
      } else {
        // (D = 0: Kᵀ is empty and kt.data() null, so no offset is formed from
        // it; gemm then writes scores 0 without reading it.)
        gemm<T>(r1 - r0, j1 - j0, D, ws.q.data() + r0 * D, D, 1, D > 0 ? ws.kt.data() + j0 : nullptr,
                ws.kt_stride, ws.s.data() + 1 + j0, lds, false);
      }
      for (index_t r = r0; r < r1; ++r) ws.s(r - r0, 0) = ws.halo_s[std::size_t(r)];
      for (index_t r = r0; r < r1; ++r) {
        const index_t lo = ws.range[r].lo, hi = ws.range[r].hi;
        const index_t lr = r - r0;  // the row in the sub-block's S, W and W̃
        T* wr = ws.w.row(lr);
        const index_t vlo = std::max(lo, k0), vhi = std::min(hi, k1);
        ws.kb[r] = ws.ke[r] = 0;
        if (vlo >= vhi) {
          if (ws.on_unit()) std::fill_n(ws.wb.data() + lr * kBc, n_cols, std::uint16_t(0));
          continue;
        }
        T* sr = ws.s.row(lr);
        // Tile columns of the visible keys: [cv0, cv1).
        const index_t cv0 = vlo - key0, cv1 = vhi - key0;
        // A unit: S = c_i ⊗ S_raw, in the same pass (the halo column is scaled
        // already); softmax's S_raw is read as it is (c_i > 0 and rounding is
        // monotone: max c_i ⊗ s = c_i ⊗ max s).
        const bool raw = !Stencil::has_halo && ws.on_unit();
        const T ci = ws.on_unit() ? ws.c[std::size_t(r)] : T(1);
        const T m_old = ws.m[r];
        const T f = detail::raise_row_max(ws.m[r], raw           ? ci * row_max(sr, cv0, cv1)
                                                   : ws.on_unit() ? row_max<true>(sr, cv0, cv1, ci)
                                                                  : row_max(sr, cv0, cv1));
        if (f != T(1)) {
          ws.l[r] *= f;
          ws.rho[r] *= f;
          T* orow = ws.o.row(r).data();
#pragma omp simd
          for (index_t d = 0; d < Dv; ++d) orow[d] *= f;
          for (index_t k = 0; k < 3; ++k) ws.near_w[std::size_t(3 * r + k)] *= f;
          ws.carry[r] *= f;
        }
        const T m = ws.m[r];
        if (raw) {
          // Softmax on a unit: the reference key (a new maximum, first where it
          // is) moves first, so that the one pass of its weights leaves its
          // term out: e^0 = 1, held apart as take_near_keys does.
          index_t skip = -1;
          if (m > m_old) {
            skip = row_find<true>(sr, cv0, cv1, m, ci);
            move_reference<Stencil>(io, b, hk, r, key0 + skip, ws);
            ws.near_key[std::size_t(3 * r + 1)] = key0 + skip;
            ws.near_w[std::size_t(3 * r + 1)] = T(1);
          }
          ws.l[r] += softmax_weights_bf16(sr, cv0, cv1, skip, r, lr, n_cols, m, ws);
          continue;
        }
        // The halo (column cv0 - 1) takes part when that key is visible too.
        const index_t ce0 = (Stencil::has_halo && vlo - 1 >= lo) ? cv0 - 1 : cv0;
        // When the row goes on past this tile, its last key's right-hand
        // segment comes with the next tile: that key is held back (carry)
        // and joins the next tile's halo column, so that every key's α
        // enters o and l as one term, once its near/far role is settled.
        const bool hold = Stencil::has_halo && hi > k1;
        T lsum;
        if constexpr (Stencil::has_halo) {
          lsum = with_accuracy<T>(ws.accuracy, [&](auto acc) {
            return row_continuum_weights<T, decltype(acc)::value>(sr, m, wr, ce0, cv1, lo >= k0, hi <= k1);
          });
          if (!hold) lsum += wr[cv1 - 1];
          if (ws.carry_key[r] >= 0) {  // key k0 − 1, column 0 (ce0 = 0: the row sees it and key k0)
            wr[0] += ws.carry[r];
            lsum += ws.carry[r];
            ws.carry_key[r] = -1;
          }
          if (hold) {
            ws.carry[r] = wr[cv1 - 1];
            ws.carry_key[r] = key0 + cv1 - 1;
            wr[cv1 - 1] = T(0);
          }
        } else {
          lsum = row_exp_sum(sr, m, wr, ce0, cv1);
        }
        if (m > m_old) move_reference<Stencil>(io, b, hk, r, key0 + row_find(sr, cv0, cv1, m), ws);
        // The near keys' terms leave the tile's sum: subtracted while they
        // are at most half of it (the difference then has at most twice the
        // sum's relative error), else the sum is taken again over what is
        // left.
        if (const T took = take_near_keys<Stencil>(r, wr, key0, ce0, hold ? cv1 - 1 : cv1, lo, hi, ws); took >= T(0))
          lsum = took <= T(0.5) * lsum ? lsum - took : row_sum(wr, ce0, cv1);
        ws.l[r] += lsum;
        // The row's own keys (halo included when visible); staged: their
        // rows of ws.vstage, the tile's columns.
        ws.kb[r] = (staged ? 0 : key0) + ce0;
        ws.ke[r] = (staged ? 0 : key0) + cv1;
        if (ws.on_unit()) weights_bf16(Dv, ce0, cv1, r, lr, n_cols, ws);
      }
      // O += W · V, each row over its own visible keys only (range_gemm): a
      // value the row cannot see never enters its sum (a unit: its weight is 0
      // and its value, when no row of the task sees it, a packed zero). A unit
      // row that sees no key of this tile passes through with zero weights when
      // another row of its sub-block sees the tile. That changes no bit of its
      // out, lse or statistics: O is changed in float (f, the halo term,
      // move_reference's terms) only in a tile the row sees, before that
      // tile's pass, so O here holds the unit's own flushed outputs (normal
      // numbers or zeros), which x + 0 · v keeps (the packed values are
      // finite: row_eligibility, or in a measuring task pack_tile_bf16's
      // zeros for the keys measure_keys found non-finite); only a zero's sign can change, and
      // write_row writes either zero as +0.
      if (ws.on_unit())
        accumulate_bf16(r0, std::min(r1, nr_tiles), nr, n_cols / bf16::kStep, ws);
      else if constexpr (staged)
        range_gemm<T>(r1 - r0, Dv, ws.w.data(), ldw, 1, 0, ws.vstage.data(), Dv, ws.o.data() + r0 * Dv,
                      Dv, ws.kb.data() + r0, ws.ke.data() + r0);
      else
        range_gemm<T>(r1 - r0, Dv, ws.w.data(), ldw, 1, key0, io.value.row(b, hk, 0), ldv,
                      ws.o.data() + r0 * Dv, Dv, ws.kb.data() + r0, ws.ke.data() + r0);
      // This tile's last score (key k1 − 1, scaled where a row sees it) is the next tile's halo.
      for (index_t r = r0; r < r1; ++r) ws.last_s[std::size_t(r)] = ws.s(r - r0, nc);
    }
  }

  for (index_t r = 0; r < nr; ++r) {
    if (partial) {  // one chunk of a split task: its row state, combined later (finish_split)
      T* orow = ws.o.row(r).data();
      if (ws.carry_key[r] >= 0) {
        add_scaled(orow, ws.carry[r], io.value.row(b, hk, ws.carry_key[r]), Dv, ws.vrow.data());
        ws.l[r] += ws.carry[r];
      }
      for (index_t k = 0; k < 3; ++k)
        if (const index_t key = ws.near_key[std::size_t(3 * r + k)]; key >= 0) {
          add_scaled(orow, ws.near_w[std::size_t(3 * r + k)], io.value.row(b, hk, key), Dv, ws.vrow.data());
          ws.l[r] += ws.near_w[std::size_t(3 * r + k)];
        }
      T* pr = partial + r * (Dv + 2);
      pr[0] = ws.m[r];
      pr[1] = ws.l[r];
      std::copy(ws.o.row(r).data(), ws.o.row(r).data() + Dv, pr + 2);
      if (seen) seen[r] = ws.keys_seen[std::size_t(r)];
    } else {
      const index_t h = h0 + r / ni, i = i0 + r % ni;
      if (ws.measure &&
          !measured_row_tiled(a, io, b, h, i, scale, ws.keys_seen[std::size_t(r)], ok, ws.on_unit()))
        continue;
      write_row<T, Stencil>(a, io, b, h, i, r, ws);
    }
  }
}

/// The rows of a split task (forward_block's arguments) from its chunks'
/// states, partial[(c · rows + r) · (Dv + 2) + …] = (m, l, o) of row r in
/// chunk c: combined in chunk order with the online row maximum, then written.
/// With ws.measure, seen[c · rows + r] is what row r saw in chunk c: a row
/// the kernel in T does not take gets its state in ok and is not written.
template <class T, class Stencil, class S>
void finish_split(const ForwardArgs<T>& a, const Stored<S>& io, index_t b, index_t h0, index_t nh, index_t i0,
                  index_t i1, double scale, ForwardWorkspace<T>& ws, char* ok, index_t chunks,
                  const T* partial, const KeysSeen<BoundType<T>>* seen = nullptr) {
  const index_t Lq = a.query.seq, Lk = a.key.seq, Dv = a.value.dim, Hq = a.query.heads;
  const index_t ni = i1 - i0, nr = nh * ni;
  for (index_t r = 0; r < nr; ++r) {
    const index_t i = i0 + r % ni, h = h0 + r / ni;
    if (ws.measure) {
      KeysSeen<BoundType<T>> all;
      for (index_t c = 0; c < chunks; ++c) all.take(seen[c * nr + r]);
      if (!measured_row_tiled(a, io, b, h, i, scale, all, ok, ws.on_unit())) continue;
    }
    ws.range[r] = row_range(a.visibility, b, i, Lq, Lk);
    if (ok && ok[(b * Hq + h) * Lq + i] != kTiled) ws.range[r] = {0, 0};
    scaled_query(a, io.query, b, h, i, scale, ws.q.row(r).data());
    T m = -std::numeric_limits<T>::infinity(), l = T(0);
    T* o = ws.o.row(r).data();
    std::fill(o, o + Dv, T(0));
    for (index_t c = 0; c < chunks; ++c) {
      const T* pr = partial + (c * nr + r) * (Dv + 2);
      if (!(pr[1] > T(0))) continue;  // the row sees no key of this chunk
      const T f = detail::raise_row_max(m, pr[0]);
      const T g = math::exp(pr[0] - m);
      l = l * f + g * pr[1];
      for (index_t d = 0; d < Dv; ++d) o[d] = o[d] * f + g * pr[2 + d];
    }
    ws.m[r] = m;
    ws.l[r] = l;
    ws.ref[r] = -1;  // (the chunks' near keys are in l and o)
    for (index_t k = 0; k < 3; ++k) ws.near_key[std::size_t(3 * r + k)] = -1;
    write_row<T, Stencil>(a, io, b, h, i, r, ws);
  }
}

/// Whether a forward task has rows to write: every task without a subset,
/// else those with a row of the subset that the kernels in T take.
inline bool task_has_rows(const std::vector<char>& ok, const char* subset, index_t b, index_t h0, index_t nh,
                          index_t i0, index_t i1, index_t Hq, index_t Lq) {
  if (!subset) return true;
  for (index_t h = h0; h < h0 + nh; ++h)
    for (index_t i = i0; i < i1; ++i)
      if (ok[std::size_t((b * Hq + h) * Lq + i)] == kTiled) return true;
  return false;
}

/// Tiled forward, arithmetic in T, of the rows in `subset` (null = every
/// row; the others' outputs are left alone). `scale` is the softmax scale
/// (validated by the caller). Rows the tiled kernel in T does not take
/// (row_eligibility, or in a decode step measure_keys) are handed to
/// declined(rows), which computes them in the
/// next wider type (backends/cpu.hpp); rows that see a NaN or an Inf get NaN
/// outputs (write_nonfinite_rows). unit: the bfloat16 unit of the tile
/// products (bf16_products.hpp) — only for float arguments that hold
/// bfloat16 values (bfloat16 storage), and only where bf16::usable(unit).
/// accuracy: the stencil's (vector_moments.hpp; bf16 for bfloat16 storage,
/// MATH.md §10). io: the queries, keys and values read and the output
/// written — a's own, or (S ≠ T) 16-bit ones in their storage type (Stored;
/// a's query, key, value and out then give only their shapes; a unit takes
/// them only as bfloat16). stats: where the
/// rows computed here leave their statistics for a backward (RowStatistics;
/// none when empty); asking for them turns the decode split off.
template <class T, class Stencil, class S, class Declined>
void forward_tiled(const ForwardArgs<T>& a, const Stored<S>& io, double scale, const char* subset,
                   Declined&& declined, bf16::Unit unit = bf16::Unit::none,
                   StencilAccuracy accuracy = StencilAccuracy::full, RowStatistics<T> stats = {}) {
  const index_t B = a.query.batch, Hq = a.query.heads, Lq = a.query.seq, D = a.query.dim;
  const index_t Dv = a.value.dim;
  // Tasks: blocks of kBr query rows of one head; when the whole GQA group's
  // rows fit in one block (decoding: Lq = 1), one task per (batch, KV head)
  // holds them all and reads each key tile once for the group.
  const index_t group = a.key.heads > 0 ? Hq / a.key.heads : 1;
  const bool grouped = group > 1 && group * Lq <= kBr;
  const index_t nh = grouped ? group : 1;
  const index_t nqb = grouped ? 1 : (Lq + kBr - 1) / kBr;
  const index_t ntasks = B * (Hq / nh) * nqb;
  const index_t task_rows = grouped ? group * Lq : std::min(Lq, kBr);
  // Key-axis split: a decode step (one task holds every query row of its
  // head or GQA group) over at least 2·kSplitKeys keys runs as chunks of
  // kSplitKeys keys, so that a few (batch, KV head) pairs still fill the
  // threads. Decided by the shape alone (never by the thread count): the
  // result is the same on any number of threads, and bitwise the full
  // forward's row wherever no split is used.
  const index_t Lk = a.key.seq;
  const index_t chunks = (!stats && nqb == 1 && Lk >= 2 * kSplitKeys) ? (Lk + kSplitKeys - 1) / kSplitKeys : 1;
  std::vector<T> partial(chunks > 1 ? std::size_t(ntasks * chunks * task_rows * (Dv + 2)) : 0);
  const int threads = int(std::max<index_t>(1, std::min<index_t>(resolve_threads(a.num_threads), ntasks)));
  std::vector<char> ok;
  constexpr bool staged = !std::is_same<S, T>::value;
  constexpr bool unit_reads_s = std::is_same<S, T>::value || std::is_same<S, bfloat16>::value;
  if (!kBf16<T> || !unit_reads_s || D == 0 || Dv == 0 || !bf16::usable(unit)) unit = bf16::Unit::none;
  // A unit's head cache (pack_tile_bf16) where a head has several tasks (row
  // blocks), up to kHeadCacheBytes of packed tiles per thread.
  index_t head_keys = 0;
  if (unit != bf16::Unit::none && nqb > 1) {
    const index_t tiles = (Lk + kBc - 1) / kBc;
    const double bytes = double(tiles * kBc) * double(round_up(D, bf16::kStep) + round_up(Dv, bf16::kCols)) * 2;
    if (bytes <= double(kHeadCacheBytes)) head_keys = Lk;
  }
  // A decode step (a task holds all rows of its head group, a few of them)
  // measures its rows' eligibility where it reads its key tiles
  // (measure_keys), instead of in a pass of its own over the KV cache
  // (row_eligibility): the same states, so the same bits.
  const bool measure = nqb == 1 && task_rows <= kMeasureRows && !stats && !a.probs && !a.cell_mass;
  index_t rejected = 0;
  if (measure)
    init_row_states(ok, B * Hq * Lq, subset);
  else
    rejected = row_eligibility<T, S>(io.query, io.key, io.value, nullptr, a.visibility, a.temperature, scale,
                                     threads, subset, ok, unit != bf16::Unit::none);
  std::vector<KeysSeen<BoundType<T>>> seen(measure && chunks > 1 ? std::size_t(ntasks * chunks * task_rows) : 0);
  if (ntasks == 0) return;
  // The jobs of one (batch, head group) — its row blocks × chunks — are taken
  // in order from its own counter. Thread t starts with the groups from
  // groups·t/threads on and then helps with the others', so that each
  // group's key tiles are mostly packed by one thread (its head cache) while
  // the load still balances job by job. Which thread runs a job changes no
  // bit: each row is computed by its own operations.
  const index_t groups = ntasks / nqb, per_group = nqb * chunks;
  std::unique_ptr<std::atomic<index_t>[]> taken(new std::atomic<index_t>[std::size_t(groups)]);
  for (index_t g = 0; g < groups; ++g) taken[std::size_t(g)].store(0, std::memory_order_relaxed);
  const CallerFloatModes modes;
#if defined(_OPENMP)
#  pragma omp parallel num_threads(threads) if (threads > 1)
#endif
  {
    const CallerFloatModes::Adopt in_caller_modes(modes);
    serial_eigen_in_this_region();
    ForwardWorkspace<T> ws(D, Dv, task_rows, unit, staged, head_keys);
    ws.accuracy = accuracy;
    ws.stats = stats;
    ws.measure = measure;
    if (measure) ws.tile_keys.resize(std::size_t(kBc));
    std::optional<bf16::TileScope> tiles;  // this thread's tile configuration, the caller's restored at the end
    if (unit == bf16::Unit::amx) tiles.emplace();
#if defined(_OPENMP)
    const index_t thread = omp_get_thread_num(), nthreads = omp_get_num_threads();
#else
    const index_t thread = 0, nthreads = 1;
#endif
    index_t k = 0;  // groups this thread has found done, from its first on
    const index_t first = groups * thread / nthreads;
    const auto next_job = [&]() -> index_t {
      for (; k < groups; ++k) {
        const index_t g = (first + k) % groups;
        const index_t i = taken[std::size_t(g)].fetch_add(1, std::memory_order_relaxed);
        if (i < per_group) return g * per_group + i;
      }
      return -1;
    };
    for (index_t job; (job = next_job()) >= 0;) {
      const index_t task = job / chunks, chunk = job % chunks;
      // Last query blocks first: under a causal mask they see the most keys.
      const index_t qb = nqb - 1 - task % nqb;
      const index_t bh = task / nqb;  // (batch, head group of nh heads)
      const index_t b = bh / (Hq / nh), h0 = bh % (Hq / nh) * nh;
      const index_t i0 = qb * kBr, i1 = std::min(Lq, i0 + kBr);
      if (!task_has_rows(ok, subset, b, h0, nh, i0, i1, Hq, Lq)) continue;  // rows outside the subset are not written
      char* okp = subset || rejected || measure ? ok.data() : nullptr;
      if (chunks == 1)
        forward_block<T, Stencil>(a, io, b, h0, nh, i0, i1, scale, ws, okp, 0, Lk, nullptr);
      else
        forward_block<T, Stencil>(a, io, b, h0, nh, i0, i1, scale, ws, okp, chunk * kSplitKeys,
                                  std::min(Lk, (chunk + 1) * kSplitKeys),
                                  partial.data() + (task * chunks + chunk) * task_rows * (Dv + 2),
                                  measure ? seen.data() + (task * chunks + chunk) * task_rows : nullptr);
    }
    if (chunks > 1) {
#if defined(_OPENMP)
#  pragma omp barrier  // every chunk is done
#  pragma omp for schedule(dynamic, 1)
#endif
      for (index_t task = 0; task < ntasks; ++task) {
        const index_t bh = task / nqb;  // nqb = 1 here
        const index_t b = bh / (Hq / nh), h0 = bh % (Hq / nh) * nh;
        const index_t i0 = 0, i1 = Lq;
        if (!task_has_rows(ok, subset, b, h0, nh, i0, i1, Hq, Lq)) continue;
        char* okp = subset || rejected || measure ? ok.data() : nullptr;
        finish_split<T, Stencil>(a, io, b, h0, nh, i0, i1, scale, ws, okp, chunks,
                                 partial.data() + task * chunks * task_rows * (Dv + 2),
                                 measure ? seen.data() + task * chunks * task_rows : nullptr);
      }
    }
  }
  if (measure)
    for (const char state : ok) rejected += state == kDeclined || state == kNonFinite;
  if (rejected > 0) {
    declined(rows_in_state(ok, kDeclined));
    write_nonfinite_rows(a, io.out, ok);
  }
}

/// The forward of a's own keys and values (the arguments above).
template <class T, class Stencil, class Declined>
void forward_tiled(const ForwardArgs<T>& a, double scale, const char* subset, Declined&& declined,
                   bf16::Unit unit = bf16::Unit::none, StencilAccuracy accuracy = StencilAccuracy::full,
                   RowStatistics<T> stats = {}) {
  forward_tiled<T, Stencil>(a, Stored<T>{a.query, a.key, a.value, a.out}, scale, subset,
                            std::forward<Declined>(declined), unit,
                            accuracy, stats);
}

// ---------------------------------------------------------------------------
// Backward.
// ---------------------------------------------------------------------------
template <class T>
struct BackwardWorkspace {
  RowMatrix<T> q;    // kBrBwd × D scaled rows c_i q_i
  RowMatrix<T> dout; // kBrBwd × Dv
  // S and dP tiles of kBcBwd keys, halos included, and K and V as their B sides.
  RowMatrix<T> kt, vt;  // D × (kBcBwd + pad), Dv × (…): key/value tile transposed
  RowMatrix<T> s;    // kBrBwd × (kBcBwd + pad): keys [k0 - 1, k1 + 1)
  RowMatrix<T> dp;   // kBrBwd × (kBcBwd + pad)
  RowMatrix<T> p;    // kBrBwd × (kBcBwd + pad): P of the tile's keys (vector tails write the pad)
  RowMatrix<T> ds;   // kBrBwd × (kBcBwd + pad): dS
  RowMatrix<T> dk, dv;  // kBcBwd × D, kBcBwd × Dv
  std::vector<T> e;  // kBcBwd + 2 pad: a row's e^{s - m}/Z
  // Per row of the tile: its visible key columns [ov0, ov1) and keys [kb, ke);
  // per key column: the rows [rb, re) that see it (key_range_gemm).
  std::vector<index_t> ov0 = std::vector<index_t>(kBrBwd), ov1 = std::vector<index_t>(kBrBwd),
                       kb = std::vector<index_t>(kBrBwd), ke = std::vector<index_t>(kBrBwd),
                       rb = std::vector<index_t>(kBcBwd), re = std::vector<index_t>(kBcBwd);
  // The score-type products S and dP on a bfloat16 unit (bf16_products.hpp;
  // bfloat16 storage computed in float): Q's and dO's bfloat16 bits (unscaled,
  // every row of the task's query heads), K and V packed
  // as the B side of a score product (depths padded to Dp, Dvq), every key
  // packed (S and dP entries of hidden pairs are formed, never read).
  bf16::Unit unit = bf16::Unit::none;
  bool on_unit() const { return unit != bf16::Unit::none; }
  // The stencil's accuracy: bf16 for bfloat16 storage computed in float.
  StencilAccuracy accuracy = StencilAccuracy::full;
  index_t Dp = 0, Dvq = 0;
  LineVector<std::uint16_t> qb, gb, kp, vkp;  // on 64-byte lines (spare_pool.hpp), as the others here
  std::vector<char> all_keys;
  // The accumulation products on the unit (accumulate_backward_bf16): D and
  // Dv padded to whole 16-column blocks (dk, dv then have Dc, Dvc columns),
  // the A side (P̃ᵀ, (c dS)̃ᵀ, dS̃: bfloat16 bits, and the pair words of the
  // transposed ones), the packed B sides (dO and q of the task's query
  // blocks, k of the key tile), a dQ scratch block, and which rows and keys
  // take part (the others' data packed as zeros, never loaded).
  index_t Dc = 0, Dvc = 0;
  LineVector<std::uint16_t> at, bdo, bq, bk;
  LineVector<std::uint32_t> words;
  LineVector<T> dqs;
  std::vector<char> rseen, kseen;
  std::vector<int> cover;
  // The terms of A-side elements that are bf16::flushed (converted to 0, as
  // the unit reads a bfloat16 denormal): summed in float apart from the unit's sums and added
  // when the gradient is written (accumulate_backward_bf16): dK and dV of the
  // key tile (kBcBwd × D, kBcBwd × Dv), dQ of the task's rows (group·Lq × D,
  // unscaled, allocated when first needed).
  RowMatrix<T> dk_small, dv_small;
  std::vector<T> dq_small;
  bool any_dk_small = false, any_dv_small = false, any_dq_small = false;
  BackwardWorkspace(index_t D, index_t Dv, bf16::Unit on = bf16::Unit::none)
      : q(kBrBwd, D), dout(kBrBwd, Dv), kt(D, kBcBwd + kPad<T>), vt(Dv, kBcBwd + kPad<T>),
        s(kBrBwd, kBcBwd + kPad<T>), dp(kBrBwd, kBcBwd + kPad<T>), p(kBrBwd, kBcBwd + kPad<T>), ds(kBrBwd, kBcBwd + kPad<T>),
        dk(kBcBwd, D), dv(kBcBwd, Dv), e(kBcBwd + 2 * kPad<T>), unit(on) {
    if (on_unit()) {
      Dp = round_up(D, bf16::kStep);
      Dvq = round_up(Dv, bf16::kStep);
      kp.resize(std::size_t((kBcBwd + 2 * bf16::kCols) * Dp));
      vkp.resize(std::size_t((kBcBwd + 2 * bf16::kCols) * Dvq));
      all_keys.assign(std::size_t(kBcBwd + 2 * bf16::kCols), 1);
      Dc = round_up(D, bf16::kCols);
      Dvc = round_up(Dv, bf16::kCols);
      dk.resize(kBcBwd, Dc);
      dv.resize(kBcBwd, Dvc);
      at.resize(std::size_t(std::max(kBcBwd * kBrBwd, round_up(kBrBwd, bf16::kRows) * round_up(kBcBwd, bf16::kStep))));
      words.resize(std::size_t(kBrBwd / 2 * kBcBwd));
      bk.resize(std::size_t(Dc * round_up(kBcBwd, bf16::kStep)));
      dqs.resize(std::size_t(round_up(kBrBwd, bf16::kRows) * Dc));
      dk_small.resize(kBcBwd, D);
      dv_small.resize(kBcBwd, Dv);
      rseen.resize(std::size_t(kBrBwd));
      kseen.resize(std::size_t(kBcBwd));
      cover.resize(std::size_t(kBcBwd + 1));
    }
  }
};

/// Per-row data of one query head, computed once per backward call.
template <class T>
struct RowInfo {
  std::vector<RowRange> range;
  std::vector<T> c, tau, m, inv_l;  // P_ij = e^{s_ij - m_i} · inv_l_i, m_i = s_i,ref
  std::vector<index_t> ref;          // the row's reference key: its first visible key at the maximum
  std::vector<T> dpref, delta, dsref;  // dP at ref; δ = Dl − dP_ref; dS at ref
  // For dτ, summed in MeasureType<T> (double, or long double for long
  // double): Σ_j dS_ij (s_ij − m_i), and to correct it for the error of δ
  // (MATH.md §6, "dτ and the error of δ"): Σ_j P_ij (s_ij − m_i) and
  // Σ_j P_ij h_ij, the δ of this sweep's own P and dP.
  std::vector<MeasureType<T>> dts, dts_p, dts_h;
};

/// One raw product q·k in W (double or wider), each term rounded (never
/// contracted into an FMA: products that overflow T and cancel, W13, stay
/// exact). float in double (every product exact) sums in vector lanes and
/// then a tree (hsum), the tail in d order; other types in d order.
template <class W, class TQ, class TK>
CONTINUUM_NO_FP_CONTRACT_FN inline W wide_dot(const TQ* q, const TK* k, index_t depth) {
  CONTINUUM_NO_FP_CONTRACT_BODY
  W s = W(0);
  index_t d = 0;
#if defined(CONTINUUM_CPU_SIMD)
  if constexpr (std::is_same<TQ, TK>::value && !std::is_same<W, TQ>::value && kWidenable<W, TQ>) {
    using N = WidenedLanes<W, TQ>;
    if (depth >= N::L) {
      typename N::V acc = {};
      for (; d + N::L <= depth; d += N::L) acc += N::widen(N::load(q + d)) * N::widen(N::load(k + d));
      s = hsum<W>(acc);
    }
  }
#endif
  for (; d < depth; ++d) s += W(q[d]) * W(k[d]);
  return s;
}

/// The backward's bfloat16-unit steps (no-ops where kBf16<T> is false: ws.unit
/// is then never set). Packs the key tile [kk0, kk0 + nk) and its values as
/// the B sides of the score products, nkp / 16 blocks.
template <class T>
void pack_backward_tile_bf16(const BackwardArgs<T>& a, index_t b, index_t hk, index_t kk0, index_t nk, index_t nkp,
                            BackwardWorkspace<T>& ws) {
  if constexpr (kBf16<T>) {
    bf16::pack_keys(a.key.row(b, hk, kk0), a.key.stride_seq, nk, a.key.dim, ws.Dp, ws.all_keys.data(),
                   nkp / bf16::kCols, ws.kp.data());
    bf16::pack_keys(a.value.row(b, hk, kk0), a.value.stride_seq, nk, a.value.dim, ws.Dvq, ws.all_keys.data(),
                   nkp / bf16::kCols, ws.vkp.data());
  }
}

/// The A sides of the score products on the unit: the bfloat16 bits
/// (unscaled) of every query and dO row of the task's query heads (row
/// gq·Lq + i), depths padded with zeros to Dp, Dvq, and one block of zero rows
/// past the end (AMX reads whole 16-row blocks); once per task.
template <class T>
void pack_backward_score_rows_bf16(const BackwardArgs<T>& a, index_t b, index_t hk, index_t group,
                                   BackwardWorkspace<T>& ws) {
  if constexpr (kBf16<T>) {
    const index_t Lq = a.query.seq, D = a.query.dim, Dv = a.value.dim;
    const std::size_t rows = std::size_t(group * Lq + bf16::kRows);
    ws.qb.assign(rows * std::size_t(ws.Dp), 0);
    ws.gb.assign(rows * std::size_t(ws.Dvq), 0);
    for (index_t gq = 0; gq < group; ++gq) {
      const index_t h = hk * group + gq;
      for (index_t i = 0; i < Lq; ++i) {
        const T* qi = a.query.row(b, h, i);
        const T* go = a.grad_out.row(b, h, i);
        std::uint16_t* qb = ws.qb.data() + (gq * Lq + i) * ws.Dp;
        std::uint16_t* gb = ws.gb.data() + (gq * Lq + i) * ws.Dvq;
        for (index_t d = 0; d < D; ++d) qb[d] = bf16::bits_exact(qi[d]);
        for (index_t d = 0; d < Dv; ++d) gb[d] = bf16::bits_exact(go[d]);
      }
    }
  }
}

/// S = c_i ⊗ (q·k) and dP = dO·v for the nr rows of query block i0 of the
/// task's query head gq against the packed tile, columns [j0, j1) (whole
/// blocks of the unit's columns), into ws.s and ws.dp.
template <class T>
void backward_scores_bf16(const BackwardArgs<T>& a, index_t gq, index_t i0, index_t nr, index_t j0, index_t j1,
                          const T* c, BackwardWorkspace<T>& ws) {
  if constexpr (kBf16<T>) {
    const index_t lds = ws.s.cols(), row0 = gq * a.query.seq + i0;
    const index_t b0 = j0 / bf16::kCols, b1 = (j1 + bf16::kCols - 1) / bf16::kCols;
    bf16::scores(ws.unit, ws.qb.data() + row0 * ws.Dp, ws.Dp, ws.Dp, ws.kp.data(), b0, b1,
                 ws.s.data() + b0 * bf16::kCols, lds, nr);
    bf16::scores(ws.unit, ws.gb.data() + row0 * ws.Dvq, ws.Dvq, ws.Dvq, ws.vkp.data(), b0, b1,
                 ws.dp.data() + b0 * bf16::kCols, lds, nr);
    for (index_t r = 0; r < nr; ++r) {
      T* sr = ws.s.row(r).data();
      const T cr = c[i0 + r];
#pragma omp simd
      for (index_t j = b0 * bf16::kCols; j < b1 * bf16::kCols; ++j) sr[j] *= cr;
    }
  }
}

/// The backward's accumulations on a bfloat16 unit (MATH.md §10, "bfloat16
/// products"), with P and dS rounded to bfloat16:
///   dV[c] += Σ_r P̃_rc dO_r,   dK[c] += Σ_r (c_r dS_rc)~ q_r,   dQ_r += Σ_c dS̃_rc k_c
/// (dQ's factor c_r is applied at the end, as on the vector path). Their B
/// sides are packed once: dO and q of every query block of the task
/// (pack_backward_rows_bf16, whole kBrBwd-row blocks) and each key tile's k
/// (pack_backward_keys_bf16). Rows and keys that no tiled row's range takes
/// are packed as zeros, never loaded, and row r's P̃ and dS̃ are zero outside
/// its key columns [ov0[r], ov1[r]), so data a row cannot see never enters
/// its sums (all data a tiled row sees is finite: row_eligibility).
template <class T>
void pack_backward_rows_bf16(const BackwardArgs<T>& a, index_t b, index_t hk, const std::vector<RowInfo<T>>& rows,
                             BackwardWorkspace<T>& ws) {
  if constexpr (kBf16<T>) {
    const index_t Lq = a.query.seq, group = index_t(rows.size()), nblk = (Lq + kBrBwd - 1) / kBrBwd;
    const std::size_t sdo = std::size_t(ws.Dvc * kBrBwd), sq = std::size_t(ws.Dc * kBrBwd);
    ws.bdo.resize(std::size_t(group * nblk) * sdo);
    ws.bq.resize(std::size_t(group * nblk) * sq);
    for (index_t gq = 0; gq < group; ++gq) {
      const index_t h = hk * group + gq;
      for (index_t blk = 0; blk < nblk; ++blk) {
        const index_t i0 = blk * kBrBwd, nr = std::min(kBrBwd, Lq - i0);
        for (index_t r = 0; r < nr; ++r)
          ws.rseen[std::size_t(r)] = char(rows[gq].range[i0 + r].hi > rows[gq].range[i0 + r].lo);
        const std::size_t at = std::size_t(gq * nblk + blk);
        bf16::pack_values(a.grad_out.row(b, h, i0), a.grad_out.stride_seq, nr, a.value.dim, ws.Dvc, ws.rseen.data(),
                          kBrBwd / bf16::kStep, ws.bdo.data() + at * sdo);
        bf16::pack_values(a.query.row(b, h, i0), a.query.stride_seq, nr, a.query.dim, ws.Dc, ws.rseen.data(),
                          kBrBwd / bf16::kStep, ws.bq.data() + at * sq);
      }
    }
  }
}

/// The keys [k0, k0 + nc) packed as the B side of dQ += dS̃ · K (keys no
/// tiled row of the task sees: zeros).
template <class T>
void pack_backward_keys_bf16(const BackwardArgs<T>& a, index_t b, index_t hk, index_t k0, index_t nc,
                             const std::vector<RowInfo<T>>& rows, BackwardWorkspace<T>& ws) {
  if constexpr (kBf16<T>) {
    std::fill(ws.cover.begin(), ws.cover.begin() + nc + 1, 0);
    for (const RowInfo<T>& ri : rows) add_cover(ri.range.data(), index_t(ri.range.size()), k0, nc, ws.cover.data());
    seen_from_cover(ws.cover.data(), nc, ws.kseen.data());
    bf16::pack_values(a.key.row(b, hk, k0), a.key.stride_seq, nc, a.query.dim, ws.Dc, ws.kseen.data(),
                      round_up(nc, bf16::kStep) / bf16::kStep, ws.bk.data());
  }
}

/// The A side of dV and dK for one query block: at = (keys × kBrBwd rows),
/// at[c·kBrBwd + r] = bfloat16(scale_r · x[r·ldx + c]) for c in row r's
/// [ov0, ov1), else 0; keys [nc, ncb) are zero rows. Row pairs are joined
/// along the keys (bf16::round_pairs), then 16 × 16 blocks of pair words are
/// transposed in registers. Returns whether some element is bf16::flushed
/// (converted to 0: accumulate_backward_bf16 adds its term apart).
template <class T>
bool transposed_bits(const T* x, index_t ldx, index_t nr, index_t nc, const T* scale, BackwardWorkspace<T>& ws) {
  bool small = false;  // some element is bf16::flushed (converted to 0)
  if constexpr (kBf16<T>) {
    const index_t ncb = round_up(nc, bf16::kCols), P = kBrBwd / 2;
    std::uint32_t* w = ws.words.data();  // P × ncb pair words, w[t·ncb + c]
    for (index_t t = 0; t < P; ++t) {
      const index_t r0 = 2 * t, r1 = 2 * t + 1;
      const bool in0 = r0 < nr, in1 = r1 < nr;
      small |= bf16::round_pairs(x + r0 * ldx, in0 && scale ? scale[r0] : T(1), in0 ? ws.ov0[r0] : 0,
                                 in0 ? ws.ov1[r0] : 0, x + r1 * ldx, in1 && scale ? scale[r1] : T(1),
                                 in1 ? ws.ov0[r1] : 0, in1 ? ws.ov1[r1] : 0, ncb, w + t * ncb);
    }
    std::uint32_t* out = reinterpret_cast<std::uint32_t*>(ws.at.data());  // ncb × P pair words
#if defined(CONTINUUM_CPU_AVX512BF16)  // (where kBf16<T> can hold: AVX-512, 16 floats a vector)
    using F = Simd<float>;
    for (index_t c0 = 0; c0 < ncb; c0 += F::W)
      for (index_t t0 = 0; t0 < P; t0 += F::W) {
        typename F::v v[F::W];
        for (index_t i = 0; i < F::W; ++i) v[i] = F::load(reinterpret_cast<const float*>(w + (t0 + i) * ncb + c0));
        transpose_block<float>(v);
        for (index_t i = 0; i < F::W; ++i) F::store(reinterpret_cast<float*>(out + (c0 + i) * P + t0), v[i]);
      }
#else
    for (index_t col = 0; col < ncb; ++col)
      for (index_t t = 0; t < P; ++t) out[col * P + t] = w[t * ncb + col];
#endif
  }
  return small;
}

/// The three accumulations of query block i0 (nr rows, block blk of head gq)
/// against key tile [k0, k0 + nc) (see pack_backward_rows_bf16), on the unit.
/// An element x of P, c dS or dS that bfloat16 would hold as a nonzero
/// denormal (2^-134 < |x| < 2^-126, bf16::flushed: a far key's weight times a
/// small dO, a tiny c), which the conversion turns into 0 (as the unit reads
/// a bfloat16 denormal), has its term x·b summed in float, from x itself, into
/// a buffer of its own (ws.dk_small, dv_small, dq_small), added when the
/// gradient is written: so it is neither rounded nor flushed by a later pass
/// of the unit, and depends on its own row and key only. (At or below 2^-134,
/// x rounds to 0 as any bfloat16 P or dS would: its term, below 2^-134·|b|,
/// is left out.)
template <class T>
void accumulate_backward_bf16(const BackwardArgs<T>& a, index_t b, index_t h, index_t hk, index_t gq, index_t blk,
                              index_t i0, index_t nr, index_t k0, index_t nc, const T* c, bool want_dk, bool want_dv,
                              BackwardWorkspace<T>& ws) {
  if constexpr (kBf16<T>) {
    const index_t D = a.query.dim, Dv = a.value.dim, ldp = ws.p.cols(), Lq = a.query.seq;
    const index_t nblk = (Lq + kBrBwd - 1) / kBrBwd, steps = kBrBwd / bf16::kStep;
    const std::size_t at = std::size_t(gq * nblk + blk);
    // term(r, col, x) for every visible x = scale_r · src[r][col] that is
    // bf16::flushed (converted to 0), with x itself.
    const auto small_terms = [&](const T* src, const T* scale, auto&& term) {
      for (index_t r = 0; r < nr; ++r) {
        const T sr = scale ? scale[r] : T(1);
        for (index_t col = ws.ov0[r]; col < ws.ov1[r]; ++col)
          if (const T x = sr * src[r * ldp + col]; bf16::flushed(x)) term(r, col, x);
      }
    };
    // dV and dK: A = (keys × rows); the AMX tiles take whole 16-key blocks,
    // so keys [nc, ncb) are zero rows (and the accumulators' rows there are
    // zeroed by the caller).
    if (want_dv) {
      const bool small = transposed_bits<T>(ws.p.data(), ldp, nr, nc, nullptr, ws);
      bf16::accumulate(ws.unit, ws.at.data(), kBrBwd, steps, ws.bdo.data() + at * std::size_t(ws.Dvc * kBrBwd),
                       ws.Dvc, ws.dv.data(), ws.Dvc, nc);
      if (small) {
        if (!ws.any_dv_small) ws.dv_small.topRows(nc).setZero();
        ws.any_dv_small = true;
        small_terms(ws.p.data(), nullptr, [&](index_t r, index_t col, T x) {
          const T* go = a.grad_out.row(b, h, i0 + r);
          T* acc = ws.dv_small.row(col).data();
          for (index_t d = 0; d < Dv; ++d) acc[d] = madd(x, go[d], acc[d]);
        });
      }
    }
    if (want_dk) {
      const bool small = transposed_bits<T>(ws.ds.data(), ldp, nr, nc, c + i0, ws);
      bf16::accumulate(ws.unit, ws.at.data(), kBrBwd, steps, ws.bq.data() + at * std::size_t(ws.Dc * kBrBwd), ws.Dc,
                       ws.dk.data(), ws.Dc, nc);
      if (small) {
        if (!ws.any_dk_small) ws.dk_small.topRows(nc).setZero();
        ws.any_dk_small = true;
        small_terms(ws.ds.data(), c + i0, [&](index_t r, index_t col, T x) {
          const T* qi = a.query.row(b, h, i0 + r);
          T* acc = ws.dk_small.row(col).data();
          for (index_t d = 0; d < D; ++d) acc[d] = madd(x, qi[d], acc[d]);
        });
      }
    }
    if (a.grad_query.data) {
      // dQ: A = dS̃ (rows × keys), whole 16-row blocks and 16-column blocks.
      const index_t ncp = round_up(nc, bf16::kStep), nrb = round_up(nr, bf16::kRows);
      std::uint16_t* ab = ws.at.data();
      std::fill(ab + nr * ncp, ab + nrb * ncp, std::uint16_t(0));
      bool small = false;
      for (index_t r = 0; r < nr; ++r)
        small |= bf16::round_row(ws.ds.data() + r * ldp, ws.ov0[r], ws.ov1[r], ncp, ab + r * ncp, nullptr);
      // Into dQ's own rows where the unit's blocks fit them (D whole 16-column
      // blocks; on AMX, whole 16-row blocks) and every row sees a key of the
      // tile; else through a scratch copy, of which only those rows go back (a
      // row that sees none must not pass through the unit: it would flush a
      // denormal partial sum). The same bits either way.
      bool direct = D == ws.Dc && (ws.unit != bf16::Unit::amx || nr % bf16::kRows == 0);
      for (index_t r = 0; r < nr && direct; ++r) direct = ws.ov1[r] > ws.ov0[r];
      if (direct) {
        bf16::accumulate(ws.unit, ab, ncp, ncp / bf16::kStep, ws.bk.data(), ws.Dc, a.grad_query.row(b, h, i0),
                         a.grad_query.stride_seq, nr);
      } else {
        T* dq = ws.dqs.data();
        for (index_t r = 0; r < nrb; ++r) {
          T* d = dq + r * ws.Dc;
          if (r < nr) std::copy(a.grad_query.row(b, h, i0 + r), a.grad_query.row(b, h, i0 + r) + D, d);
          else std::fill(d, d + D, T(0));
          std::fill(d + D, d + ws.Dc, T(0));
        }
        bf16::accumulate(ws.unit, ab, ncp, ncp / bf16::kStep, ws.bk.data(), ws.Dc, dq, ws.Dc, nr);
        for (index_t r = 0; r < nr; ++r)
          if (ws.ov1[r] > ws.ov0[r]) std::copy(dq + r * ws.Dc, dq + r * ws.Dc + D, a.grad_query.row(b, h, i0 + r));
      }
      if (small) {
        if (!ws.any_dq_small) ws.dq_small.assign(std::size_t(a.query.heads / a.key.heads * Lq * D), T(0));
        ws.any_dq_small = true;
        small_terms(ws.ds.data(), nullptr, [&](index_t r, index_t col, T x) {
          const T* kj = a.key.row(b, hk, k0 + col);
          T* acc = ws.dq_small.data() + (gq * Lq + i0 + r) * D;
          for (index_t d = 0; d < D; ++d) acc[d] = madd(x, kj[d], acc[d]);
        });
      }
    }
  }
}

template <class T, class Stencil>
void backward_head(const BackwardArgs<T>& a, const char* ok, index_t b, index_t hk, double scale,
                   const RowStatistics<const T>& given, const RowStatistics<const T>& own,
                   BackwardWorkspace<T>& ws,
                   std::vector<RowInfo<T>>& rows /* one per query head of the group */) {
  const bool want_dk = a.grad_key.data != nullptr;
  const bool want_dv = a.grad_value.data != nullptr;
  const bool want_dtau = a.grad_temperature != nullptr;
  // On a bfloat16 unit the forward's δ comes from weights rounded to
  // bfloat16: dτ is corrected after the sweep (MATH.md §6, "dτ and the error of δ").
  const bool correct_dtau = want_dtau && ws.on_unit();
  const index_t Lq = a.query.seq, Lk = a.key.seq, D = a.query.dim, Dv = a.value.dim;
  const index_t Hq = a.query.heads, group = Hq / a.key.heads;
  const index_t ldk = a.key.stride_seq, ldv = a.value.stride_seq;
  const index_t lds = ws.s.cols();
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  using W = MeasureType<T>;

  // Per-row setup: ranges and scales.
  for (index_t gq = 0; gq < group; ++gq) {
    const index_t h = hk * group + gq;
    RowInfo<T>& ri = rows[gq];
    ri.range.resize(Lq);
    ri.c.resize(Lq);
    ri.tau.resize(Lq);
    ri.m.assign(Lq, kNegInf);
    ri.inv_l.assign(Lq, T(0));
    ri.ref.assign(Lq, -1);
    ri.dpref.assign(Lq, T(0));
    ri.delta.assign(Lq, T(0));
    ri.dsref.assign(Lq, T(0));
    ri.dts.assign(Lq, W(0));
    ri.dts_p.assign(correct_dtau ? Lq : 0, W(0));
    ri.dts_h.assign(correct_dtau ? Lq : 0, W(0));
    for (index_t i = 0; i < Lq; ++i) {
      ri.range[i] = row_range(a.visibility, b, i, Lq, Lk);
      ri.tau[i] = temperature_at(a.temperature, b, h, i, Hq, Lq);
      ri.c[i] = T(MeasureType<T>(scale) / MeasureType<T>(ri.tau[i]));
      if (ri.range[i].hi <= ri.range[i].lo || (ok && ok[(b * Hq + h) * Lq + i] != kTiled))
        ri.range[i] = {0, 0};  // empty (or declined, or not in the subset): no contribution here
    }
    if (a.grad_query.data)
      for (index_t i = 0; i < Lq; ++i) {
        T* dq = a.grad_query.row(b, h, i);
        std::fill(dq, dq + D, T(0));
      }
  }

  // Key tiles of kBcBwd - 2 keys for continuum: with a halo key on each side
  // the S and dP products are kBcBwd columns wide, a whole number of vectors.
  constexpr index_t kTile = Stencil::has_halo ? kBcBwd - 2 : kBcBwd;

  // The key tile [kk0, kk0 + nk) and its values as the B sides of the score
  // products (the products read nkp columns; on the vector path the rows are
  // kt.cols() = kBcBwd + kPad long, zeros past nk, not the tile's 512 bytes of
  // float: ForwardWorkspace::kt_stride).
  const auto pack_score_tile = [&](index_t kk0, index_t nk, index_t nkp) {
    if (ws.on_unit()) return pack_backward_tile_bf16(a, b, hk, kk0, nk, nkp, ws);
    pack_transposed(a.key.row(b, hk, kk0), ldk, nk, D, ws.kt.data(), ws.kt.cols());
    pack_transposed(a.value.row(b, hk, kk0), ldv, nk, Dv, ws.vt.data(), ws.vt.cols());
  };
  // The columns [j0, j1) of the tile's S and dP that the rows of query block
  // [i0, i1) read: the knots [kk0, kz) of rows that see a key of [k0, k1),
  // widened to whole vectors (at most nkp); j0 ≥ j1 when no row sees one.
  const auto block_columns = [](const RowInfo<T>& ri, index_t i0, index_t i1, index_t k0, index_t k1, index_t kk0,
                                index_t kz, index_t nkp) {
    index_t j0 = nkp, j1 = 0;
    for (index_t i = i0; i < i1; ++i) {
      const RowRange rg = ri.range[i];
      if (!(rg.lo < k1 && rg.hi > k0)) continue;
      j0 = std::min(j0, std::max(rg.lo, kk0) - kk0);
      j1 = std::max(j1, std::min(rg.hi, kz) - kk0);
    }
    return std::pair<index_t, index_t>(j0 / kPad<T> * kPad<T>, std::min(round_up(j1, kPad<T>), nkp));
  };
  // S = (c_i q_i)·k and dP = dO_i·v of query block [i0, i0 + nr) of query
  // head gq against the packed key tile, into columns [j0, j1) of ws.s and
  // ws.dp; on the vector path ws.q and ws.dout keep the block's c_i q_i and
  // dO_i.
  const auto tile_scores = [&](index_t gq, const RowInfo<T>& ri, index_t i0, index_t nr, index_t j0, index_t j1) {
    if (ws.on_unit()) return backward_scores_bf16(a, gq, i0, nr, j0, j1, ri.c.data(), ws);
    const index_t h = hk * group + gq;
    for (index_t r = 0; r < nr; ++r) {
      const T* qi = a.query.row(b, h, i0 + r);
      const T c = ri.c[i0 + r];
      T* qs = ws.q.row(r).data();
      for (index_t d = 0; d < D; ++d) qs[d] = c * qi[d];
      const T* go = a.grad_out.row(b, h, i0 + r);
      std::copy(go, go + Dv, ws.dout.row(r).data());
    }
    // (D or Dv = 0: that Kᵀ or Vᵀ is empty and its data() null, so no offset
    // is formed from it; gemm then writes products 0 without reading it.)
    gemm<T>(nr, j1 - j0, D, ws.q.data(), D, 1, D > 0 ? ws.kt.data() + j0 : nullptr, ws.kt.cols(), ws.s.data() + j0,
            lds, false);
    gemm<T>(nr, j1 - j0, Dv, ws.dout.data(), Dv, 1, Dv > 0 ? ws.vt.data() + j0 : nullptr, ws.vt.cols(),
            ws.dp.data() + j0, lds, false);
  };
  if (ws.on_unit()) pack_backward_score_rows_bf16(a, b, hk, group, ws);

  // Row statistics from the forward (MATH.md §6, "row statistics from the
  // forward"), in the reference-key form: with ref_i the row's first visible
  // key at the maximum, m_i = s_i,ref and h_ij = dP_ij − dP_i,ref,
  //   δ_i = Dl_i − dP_i,ref = Σ_j α̃_ij h_ij / Z̃_i,   g_ij = dP_ij − Dl_i = h_ij − δ_i,
  // so that nothing cancels when attention is concentrated on ref (FlashAttention-2's
  // Dl = dO·o of the rounded output cancels there), and dS_ref comes from
  // reference_grad_score (a sum of terms without cancellation). The forward
  // kept the near keys (ref and its neighbours) apart: Σ_far α̃_j h_j =
  // dO · Σ_far α̃_j (v_j − v_ref), a product with its far_diff; the near
  // keys' h are formed here, in W.
  const index_t near = Stencil::has_halo ? 1 : 0;  // continuum's near keys: ref ± 1
  for (index_t gq = 0; gq < group; ++gq) {
    const index_t h = hk * group + gq;
    RowInfo<T>& ri = rows[gq];
    for (index_t i = 0; i < Lq; ++i) {
      const RowRange rg = ri.range[i];
      if (rg.hi <= rg.lo) continue;
      const index_t row = (b * Hq + h) * Lq + i;
      const RowStatistics<const T>& st = given.has(row) ? given : own;
      const index_t ref = st.ref[row];
      const T* nw = st.near(row);
      const W a_ref = W(nw[1]), a_other = W(st.far_sum(row)) + W(nw[0]) + W(nw[2]);
      const W z = a_ref + a_other;
      if (ref < 0 || !(z > 0)) {
        ri.range[i] = {0, 0};
        continue;
      }
      ri.m[i] = st.m(row);
      ri.ref[i] = ref;
      // Raw scores and dP in W from the stored data (not the scaled tile),
      // shifted by the raw score of ref: s_k − s_ref = c·(r_k − r_ref).
      const T* qi = a.query.row(b, h, i);
      const T* go = a.grad_out.row(b, h, i);
      const W cw = W(scale) / W(ri.tau[i]);
      const W mraw = wide_dot<W>(qi, a.key.row(b, hk, ref), D);
      const W dpref = wide_dot<W>(go, a.value.row(b, hk, ref), Dv);
      const auto score = [&](index_t j) { return cw * (wide_dot<W>(qi, a.key.row(b, hk, j), D) - mraw); };
      const auto dp = [&](index_t j) { return wide_dot<W>(go, a.value.row(b, hk, j), Dv); };
      W e_near = W(0);
      for (index_t j = std::max(ref - near, rg.lo); j <= ref + near && j < rg.hi; ++j)
        if (j != ref) e_near += W(nw[j - ref + 1]) * (dp(j) - dpref);
      const W e_far = wide_dot<W>(go, st.far_diff(row), Dv);
      ri.inv_l[i] = T(W(1) / z);
      ri.delta[i] = T((e_far + e_near) / z);
      ri.dpref[i] = T(dpref);
      const W zds =
          detail::reference_grad_score<Stencil>(rg.lo, rg.hi, ref, score, dp, dpref, a_ref, a_other, z, e_far, e_near);
      ri.dsref[i] = T(zds / z);
    }
  }

  if (ws.on_unit()) pack_backward_rows_bf16(a, b, hk, rows, ws);
  ws.any_dq_small = false;
  for (index_t k0 = 0; k0 < Lk; k0 += kTile) {
    const index_t k1 = std::min(k0 + kTile, Lk);
    const index_t nc = k1 - k0;
    const index_t kk0 = Stencil::has_halo ? std::max<index_t>(k0 - 1, 0) : k0;
    const index_t kk1 = Stencil::has_halo ? std::min(k1 + 1, Lk) : k1;
    const index_t off = k0 - kk0;  // column of key k0 in s/dp
    const index_t nk = kk1 - kk0;
    // (A unit's tiles take whole 16-key blocks of the accumulators.)
    const index_t nz = ws.on_unit() ? std::min(round_up(nc, bf16::kRows), kBcBwd) : nc;
    ws.dk.topRows(nz).setZero();
    ws.dv.topRows(nz).setZero();
    ws.any_dk_small = ws.any_dv_small = false;
    const index_t nkp = round_up(nk, kPad<T>);
    if (ws.on_unit() && a.grad_query.data) pack_backward_keys_bf16(a, b, hk, k0, nc, rows, ws);
    pack_score_tile(kk0, nk, nkp);

    for (index_t gq = 0; gq < group; ++gq) {
      const index_t h = hk * group + gq;
      RowInfo<T>& ri = rows[gq];
      for (index_t i0 = 0; i0 < Lq; i0 += kBrBwd) {
        const index_t i1 = std::min(Lq, i0 + kBrBwd);
        const index_t nr = i1 - i0;
        const auto [j0, j1] = block_columns(ri, i0, i1, k0, k1, kk0, kk1, nkp);
        if (j0 >= j1) continue;
        tile_scores(gq, ri, i0, nr, j0, j1);

        for (index_t r = 0; r < nr; ++r) {
          const index_t i = i0 + r;
          const index_t lo = ri.range[i].lo, hi = ri.range[i].hi;
          T* pr = ws.p.row(r).data();
          T* dsr = ws.ds.row(r).data();
          ws.kb[r] = ws.ke[r] = 0;
          // A row that sees no key of the tile: an empty range at the tile's
          // end when its keys come after it, else at its start, so that under
          // a sliding window the rows' ranges stay monotone (key_range_gemm).
          ws.ov0[r] = ws.ov1[r] = lo >= k1 ? nc : 0;
          if (!(lo < k1 && hi > k0)) continue;
          T* sr = ws.s.row(r).data();
          T* dpr = ws.dp.row(r).data();
          const T m = ri.m[i], inv_l = ri.inv_l[i], dpref = ri.dpref[i], delta = ri.delta[i];
          // At ref the tile takes the row statistics' own values (the
          // forward's score and this dP_ref agree with the tile's products to
          // rounding, not bit for bit), so that s_ref − m = 0 and h_ref = 0
          // exactly: the reference-key form rests on them.
          if (ri.ref[i] >= kk0 && ri.ref[i] < kk1) {
            sr[ri.ref[i] - kk0] = m;
            dpr[ri.ref[i] - kk0] = dpref;
          }
          // Visible knots of the extended tile (columns [kv0, kv1)) and the
          // visible output columns [ov0, ov1) (column c of p/ds is key k0 + c).
          const index_t kv0 = std::max<index_t>(lo - kk0, 0), kv1 = std::min(hi - kk0, nk);
          const index_t ov0 = std::max(lo, k0) - k0, ov1 = std::min(hi, k1) - k0;
          ws.ov0[r] = ov0;
          ws.ov1[r] = ov1;
          ws.kb[r] = k0 + ov0;
          ws.ke[r] = k0 + ov1;
          W dts = 0;
          if constexpr (Stencil::has_halo) {
            T* e = ws.e.data();  // e^{s - m}/Z of the row's knots
            row_exp(sr, e, m, kv0, kv1, inv_l);
            with_accuracy<T>(ws.accuracy, [&](auto acc) {
              row_gradient_terms<T, decltype(acc)::value>(sr, e, dpr, dpref, delta, kv0, kv1, lo >= kk0,
                                                          hi <= kk1, off, pr, dsr);
            });
          } else {
            row_softmax_grad(sr, dpr, pr, dsr, m, inv_l, dpref, delta, ov0, ov1);  // P = e^{s - m}/Z (off = 0), dS
          }
          // dτ's Σ dS·(s − m), only when dτ is wanted, with Σ P·(s − m) and
          // Σ P·h where it is corrected after the sweep.
          W dts_p = 0, dts_h = 0;
          if (want_dtau) dts = shifted_dot<T, W>(dsr, sr + off, m, ov0, ov1);
          if (correct_dtau) {
            dts_p = shifted_dot<T, W>(pr, sr + off, m, ov0, ov1);
            dts_h = shifted_dot<T, W>(pr, dpr + off, dpref, ov0, ov1);
          }
          // dS at ref in its cancellation-free form (the stencil's value there
          // is a difference of nearly equal terms when attention is concentrated);
          // its dτ term is 0 either way (s_ref − m = 0).
          if (ri.ref[i] >= k0 && ri.ref[i] < k1) dsr[ri.ref[i] - k0] = ri.dsref[i];
          if (hi - lo == 1) {
            // One visible key: P ≡ 1 whatever the score, so dS = 0 exactly
            // (the computed dP - Dl would leave a rounding residue).
            std::fill(dsr + ov0, dsr + ov1, T(0));
            dts = dts_p = dts_h = 0;
          }
          ri.dts[i] += dts;
          if (correct_dtau) {
            ri.dts_p[i] += dts_p;
            ri.dts_h[i] += dts_h;
          }
        }
        // dV += Pᵀ dO, dK += dSᵀ (c q), dQ += dS K: each output sums only the
        // (query, key) pairs that see each other (range_gemm, key_range_gemm),
        // so a key, value, query or dO hidden from an output never enters it.
        const index_t ldp = ws.p.cols();
        if (ws.on_unit()) {
          accumulate_backward_bf16(a, b, h, hk, gq, i0 / kBrBwd, i0, nr, k0, nc, ri.c.data(), want_dk, want_dv, ws);
          continue;
        }
        if (want_dv)
          key_range_gemm<T>(nc, nr, Dv, ws.p.data(), ldp, ws.dout.data(), Dv, ws.dv.data(), Dv, ws.ov0.data(),
                            ws.ov1.data(), ws.rb.data(), ws.re.data());
        if (want_dk)
          key_range_gemm<T>(nc, nr, D, ws.ds.data(), ldp, ws.q.data(), D, ws.dk.data(), D, ws.ov0.data(),
                            ws.ov1.data(), ws.rb.data(), ws.re.data());
        if (a.grad_query.data)
          range_gemm<T>(nr, D, ws.ds.data(), ldp, 1, k0, a.key.row(b, hk, 0), ldk, a.grad_query.row(b, h, i0),
                        a.grad_query.stride_seq, ws.kb.data(), ws.ke.data());
      }
    }
    // A bfloat16 unit: a sum it flushed to −0 would take its sign from the
    // 0 · x terms of rows that do not see the key (unsigned_zero; dQ below).
    // (Plus the terms the unit reads as 0, summed apart: accumulate_backward_bf16.)
    const auto sign_free = [](T x) { return unsigned_zero(x); };
    if (a.grad_key.data) {
      StridedMap<T> dK(a.grad_key.row(b, hk, k0), nc, D, Eigen::OuterStride<>(a.grad_key.stride_seq));
      if (ws.any_dk_small) dK = (ws.dk.topLeftCorner(nc, D) + ws.dk_small.topRows(nc)).unaryExpr(sign_free);
      else if (ws.on_unit()) dK = ws.dk.topLeftCorner(nc, D).unaryExpr(sign_free);
      else dK = ws.dk.topLeftCorner(nc, D);
    }
    if (a.grad_value.data) {
      StridedMap<T> dV(a.grad_value.row(b, hk, k0), nc, Dv, Eigen::OuterStride<>(a.grad_value.stride_seq));
      if (ws.any_dv_small) dV = (ws.dv.topLeftCorner(nc, Dv) + ws.dv_small.topRows(nc)).unaryExpr(sign_free);
      else if (ws.on_unit()) dV = ws.dv.topLeftCorner(nc, Dv).unaryExpr(sign_free);
      else dV = ws.dv.topLeftCorner(nc, Dv);
    }
  }
  // dτ on a bfloat16 unit: dS = T(h) − δ·P took the forward's δ, from the
  // weights rounded to bfloat16 (MATH.md §6, "dτ and the error of δ"); the
  // sweep's own δ' = Σ_j P_ij h_ij gives Σ_j dS'_ij (s_ij − m_i) = Σ_j dS_ij
  // (s_ij − m_i) + (δ − δ') Σ_j P_ij (s_ij − m_i).
  if (correct_dtau)
    for (RowInfo<T>& ri : rows)
      for (index_t i = 0; i < Lq; ++i) ri.dts[i] += (W(ri.delta[i]) - ri.dts_h[i]) * ri.dts_p[i];
  // dQ_i = c_i Σ_j dS_ij k_j: the scale was left out of the accumulation (on
  // a bfloat16 unit through unsigned_zero: the 0 · k of keys the row does not
  // see).
  if (a.grad_query.data)
    for (index_t gq = 0; gq < group; ++gq) {
      const index_t h = hk * group + gq;
      for (index_t i = 0; i < Lq; ++i) {
        T* dq = a.grad_query.row(b, h, i);
        const T c = rows[gq].c[i];
        if (ws.any_dq_small) {
          const T* small = ws.dq_small.data() + (gq * Lq + i) * D;
          for (index_t d = 0; d < D; ++d) dq[d] = unsigned_zero((dq[d] + small[d]) * c);
        } else if (ws.on_unit()) {
          for (index_t d = 0; d < D; ++d) dq[d] = unsigned_zero(dq[d] * c);
        } else {
          for (index_t d = 0; d < D; ++d) dq[d] *= c;
        }
      }
    }
}

/// dτ in the temperature's shape from per-row values -(1/τ_i) Σ_j dS_ij s_ij,
/// summed in double in the order every backend uses
/// (detail::GradTemperatureOrder; MATH.md §8 shapes, §10 determinism).
template <class T>
void write_grad_temperature(const BackwardArgs<T>& a, const std::vector<double>& dtau_rows) {
  if (a.temperature.shape == TemperatureShape::per_query) {
    for (std::size_t i = 0; i < dtau_rows.size(); ++i) a.grad_temperature[i] = accum_t<T>(dtau_rows[i]);
    return;
  }
  const detail::GradTemperatureOrder order{a.temperature.shape, a.query.batch, a.query.heads, a.query.seq};
  for (index_t out = 0; out < order.outputs(); ++out)
    a.grad_temperature[out] = accum_t<T>(
        detail::fixed_order_sum<double>(order, out, [&](index_t row) { return dtau_rows[std::size_t(row)]; }));
}

/// The tiled backward over every (batch, KV head); returns the per-row dτ
/// terms -(1/τ_i) Σ_j dS_ij s_ij (empty when no dτ is wanted).
template <class T, class Stencil>
std::vector<double> backward_run(const BackwardArgs<T>& a, const char* ok, double scale, int threads,
                                       index_t group, bf16::Unit unit, StencilAccuracy accuracy,
                                       const RowStatistics<const T>& given, const RowStatistics<const T>& own) {
  const index_t B = a.query.batch, Hq = a.query.heads, Hk = a.key.heads, Lq = a.query.seq;
  const index_t D = a.query.dim, Dv = a.value.dim;
  const index_t ntasks = B * Hk;
  std::vector<double> dtau_rows(a.grad_temperature ? std::size_t(B * Hq * Lq) : 0);
  const CallerFloatModes modes;
#if defined(_OPENMP)
#  pragma omp parallel num_threads(threads) if (threads > 1)
#endif
  {
    const CallerFloatModes::Adopt in_caller_modes(modes);
    serial_eigen_in_this_region();
    BackwardWorkspace<T> ws(D, Dv, unit);
    ws.accuracy = accuracy;
    std::optional<bf16::TileScope> tiles;  // this thread's tile configuration, the caller's restored at the end
    if (unit == bf16::Unit::amx) tiles.emplace();
    std::vector<RowInfo<T>> rows(static_cast<std::size_t>(group));
#if defined(_OPENMP)
#  pragma omp for schedule(dynamic, 1)
#endif
    for (index_t task = 0; task < ntasks; ++task) {
      const index_t b = task / Hk, hk = task % Hk;
      backward_head<T, Stencil>(a, ok, b, hk, scale, given, own, ws, rows);
      if (a.grad_temperature)
        for (index_t gq = 0; gq < group; ++gq) {
          const index_t h = hk * group + gq;
          for (index_t i = 0; i < Lq; ++i)
            dtau_rows[std::size_t((b * Hq + h) * Lq + i)] =
                double(-rows[gq].dts[i] / MeasureType<T>(rows[gq].tau[i]));
        }
    }
  }
  return dtau_rows;
}

/// Tiled backward, arithmetic in T, of the rows in `subset` (null = every
/// row): writes dQ of those rows, dK and dV from those rows alone (every key
/// is written) and returns their per-row dτ terms (empty when no dτ is
/// wanted; 0 for the other rows); grad_temperature itself is not written.
/// Rows the tiled kernel in T does not take (row_eligibility) are handed to
/// declined(rows, dtau_rows), which writes their dQ, adds their dK, dV terms
/// and sets their dτ terms (backends/cpu.hpp). unit and accuracy as for
/// forward_tiled. given: the forward's row statistics (RowStatistics, in T),
/// where it left them; the others are computed here.
template <class T, class Stencil, class Declined>
std::vector<double> backward_tiled(const BackwardArgs<T>& a, double scale, const char* subset, Declined&& declined,
                                   bf16::Unit unit = bf16::Unit::none,
                                   StencilAccuracy accuracy = StencilAccuracy::full,
                                   RowStatistics<const T> given = {}) {
  const index_t B = a.query.batch, Hq = a.query.heads, Hk = a.key.heads, Lq = a.query.seq;
  const index_t group = Hk > 0 ? Hq / Hk : 0;  // Hk = 0 (nothing to do): no division by zero
  const index_t ntasks = B * Hk;
  const int threads = int(std::max<index_t>(1, std::min<index_t>(resolve_threads(a.num_threads), ntasks)));
  std::vector<char> ok;
  if (!kBf16<T> || a.query.dim == 0 || a.value.dim == 0 || !bf16::usable(unit)) unit = bf16::Unit::none;
  const index_t rejected = row_eligibility<T>(a.query, a.key, a.value, &a.grad_out, a.visibility, a.temperature,
                                              scale, threads, subset, ok, unit != bf16::Unit::none);
  const char* okp = subset || rejected ? ok.data() : nullptr;
  std::vector<double> dtau_rows;
  if (ntasks > 0) {
    // The row statistics: the caller's (given), else the forward of the rows
    // taken here, in T with the same products and stencil (its output is not
    // needed), into `own`.
    const index_t rows = B * Hq * Lq, width = row_stats_width(a.value.dim);
    if (given)
      for (index_t r = 0; r < rows; ++r) {
        const RowRange rg = row_range(a.visibility, r / (Hq * Lq), r % Lq, Lq, a.key.seq);
        if (given.has(r) && (given.ref[r] < rg.lo || given.ref[r] >= rg.hi))
          throw std::invalid_argument("continuum: the row statistics passed to the backward name a reference key "
                                      "outside their row's visible keys (statistics of another call?)");
      }
    std::vector<char> taken(std::size_t(rows), 0);
    index_t missing = 0;
    for (index_t r = 0; r < rows; ++r)
      missing += taken[std::size_t(r)] = (!okp || ok[std::size_t(r)] == kTiled) && !given.has(r);
    std::vector<T> values, out;
    std::vector<index_t> ref;
    RowStatistics<T> own;
    if (missing > 0) {
      values.resize(std::size_t(rows * width));
      out.resize(std::size_t(rows * a.value.dim));
      ref.assign(std::size_t(rows), -1);
      own = {values.data(), ref.data(), width};
      ForwardArgs<T> fa;
      static_cast<AttentionOptions<T>&>(fa) = a;
      fa.num_threads = threads;
      fa.query = a.query;
      fa.key = a.key;
      fa.value = a.value;
      fa.out = TensorView<T>::bhsd(out.data(), B, Hq, Lq, a.value.dim);
      forward_tiled<T, Stencil>(
          fa, scale, taken.data(),
          [](const std::vector<index_t>&) {
            throw std::logic_error("continuum: the backward's forward declined a row that the backward takes");
          },
          unit, accuracy, own);
    }
    dtau_rows = backward_run<T, Stencil>(a, okp, scale, threads, group, unit, accuracy, given,
                                         RowStatistics<const T>{own.values, own.ref, width});
  }
  else if (a.grad_temperature)
    dtau_rows.assign(std::size_t(B * Hq * Lq), 0.0);
  if (rejected > 0) {
    declined(rows_in_state(ok, kDeclined), dtau_rows);
    write_nonfinite_rows(a, ok, dtau_rows);
  }
  return dtau_rows;
}

}  // namespace tiled
}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
