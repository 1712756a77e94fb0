// backends/cpu/simd.hpp — the one place that picks the CPU vector width for the
// tiled kernels. GCC/Clang vector extensions give portable vector code: the
// compiler emits AVX-512, AVX or SSE for the same source depending on -march.
// Other compilers get the scalar loops (CONTINUUM_CPU_SIMD undefined).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "isa.hpp"  // CONTINUUM_CPU_SIMD, the kernels' namespace

#if defined(CONTINUUM_CPU_SIMD) && defined(__SSE2__)
#  include <immintrin.h>
#endif

/// Functions whose products must each be rounded (never contracted into FMAs):
/// put CONTINUUM_NO_FP_CONTRACT_FN before the declaration and
/// CONTINUUM_NO_FP_CONTRACT_BODY first in the body.
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

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

/// a·b + c for scalars, with one rounding where the CPU has an FMA instruction
/// (-march with FMA) and two otherwise, *whatever the compiler decides about
/// contracting* a·b + c: the tile products must give each element the same
/// bits in every instantiation (row/column blocking), or a KV-cache decode
/// step would differ from its row of the full forward. (GCC 12 with AVX2 left
/// one instantiation of the micro-kernel uncontracted.)
template <class T>
inline T madd(T a, T b, T c) {
#if defined(__FMA__) || defined(__AVX512F__)
  return __builtin_fma(a, b, c);
#else
  return a * b + c;
#endif
}
inline float madd(float a, float b, float c) {
#if defined(__FMA__) || defined(__AVX512F__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
/// long double (the widened compute type, MATH.md §10): two roundings, as the
/// x87 unit has no fused multiply-add.
inline long double madd(long double a, long double b, long double c) { return a * b + c; }

/// Whether the tiled kernels run T on whole vectors: float and double with the
/// GCC/Clang vector extensions. Other compute types (long double, for the rows
/// double cannot hold) take the scalar loops; kLanes<T> is then 1.
template <class T>
inline constexpr bool kVector =
#if defined(CONTINUUM_CPU_SIMD)
    std::is_same<T, float>::value || std::is_same<T, double>::value;
#else
    false;
#endif

#if defined(CONTINUUM_CPU_SIMD)
#  if defined(__AVX512F__)
inline constexpr int kSimdBytes = 64;
#  elif defined(__AVX__)
inline constexpr int kSimdBytes = 32;
#  else
inline constexpr int kSimdBytes = 16;
#  endif
template <class T>
inline constexpr int kLanes = kVector<T> ? kSimdBytes / int(sizeof(T)) : 1;
#else
template <class T>
inline constexpr int kLanes = 1;
#endif
#if defined(CONTINUUM_CPU_SIMD)

template <class T>
struct SimdInt;
template <>
struct SimdInt<float> {
  using type = std::int32_t;
};
template <>
struct SimdInt<double> {
  using type = std::int64_t;
};

/// v: a full vector of T; vu: the same, for unaligned loads and stores;
/// vi: the integer vector of the same lane count (comparison masks, bit casts).
template <class T>
struct Simd {
  typedef T v __attribute__((vector_size(kSimdBytes)));
  typedef T vu __attribute__((vector_size(kSimdBytes), aligned(alignof(T)), may_alias));
  typedef typename SimdInt<T>::type vi __attribute__((vector_size(kSimdBytes)));
  static constexpr int W = kSimdBytes / int(sizeof(T));
  static v load(const T* p) { return *reinterpret_cast<const vu*>(p); }
  static void store(T* p, v x) { *reinterpret_cast<vu*>(p) = x; }
  /// {0, 1, …, W − 1}: each lane's index (masks of a partial vector).
  static vi lanes() {
    vi x{};
    for (int k = 0; k < W; ++k) x[k] = k;
    return x;
  }
};

/// Vector a·b + c (a broadcast scalar), the vector form of madd() above:
/// fused where the CPU has FMA, mul then add otherwise (never left to
/// contraction).
template <class T>
inline typename Simd<T>::v vmadd(T a, typename Simd<T>::v b, typename Simd<T>::v c) {
#  if defined(__AVX512F__) || defined(__FMA__)
  using V = typename Simd<T>::v;
#  endif
#  if defined(__AVX512F__)
  if constexpr (kSimdBytes == 64) {
    if constexpr (sizeof(T) == 4)
      return (V)_mm512_fmadd_ps(_mm512_set1_ps(float(a)), (__m512)b, (__m512)c);
    else
      return (V)_mm512_fmadd_pd(_mm512_set1_pd(double(a)), (__m512d)b, (__m512d)c);
  }
#  endif
#  if defined(__FMA__)
  if constexpr (kSimdBytes == 32) {
    if constexpr (sizeof(T) == 4)
      return (V)_mm256_fmadd_ps(_mm256_set1_ps(float(a)), (__m256)b, (__m256)c);
    else
      return (V)_mm256_fmadd_pd(_mm256_set1_pd(double(a)), (__m256d)b, (__m256d)c);
  }
  if constexpr (kSimdBytes == 16) {
    if constexpr (sizeof(T) == 4)
      return (V)_mm_fmadd_ps(_mm_set1_ps(float(a)), (__m128)b, (__m128)c);
    else
      return (V)_mm_fmadd_pd(_mm_set1_pd(double(a)), (__m128d)b, (__m128d)c);
  }
#  endif
  return a * b + c;  // no FMA instruction: nothing to contract into
}

/// The lanes k with x[k] == y, as bit k of the result (an ordered comparison:
/// never true for a NaN); the vector compare's own mask where the CPU has one.
template <class T>
inline unsigned equal_lanes(typename Simd<T>::v x, T y) {
#  if defined(__AVX512F__)
  if constexpr (kSimdBytes == 64) {
    if constexpr (sizeof(T) == 4)
      return _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(float(y)), _CMP_EQ_OQ);
    else
      return _mm512_cmp_pd_mask((__m512d)x, _mm512_set1_pd(double(y)), _CMP_EQ_OQ);
  }
#  endif
#  if defined(__AVX__)
  if constexpr (kSimdBytes == 32) {
    if constexpr (sizeof(T) == 4)
      return unsigned(_mm256_movemask_ps(_mm256_cmp_ps((__m256)x, _mm256_set1_ps(float(y)), _CMP_EQ_OQ)));
    else
      return unsigned(_mm256_movemask_pd(_mm256_cmp_pd((__m256d)x, _mm256_set1_pd(double(y)), _CMP_EQ_OQ)));
  }
#  endif
#  if defined(__SSE2__)
  if constexpr (kSimdBytes == 16) {
    if constexpr (sizeof(T) == 4)
      return unsigned(_mm_movemask_ps(_mm_cmpeq_ps((__m128)x, _mm_set1_ps(float(y)))));
    else
      return unsigned(_mm_movemask_pd(_mm_cmpeq_pd((__m128d)x, _mm_set1_pd(double(y)))));
  }
#  endif
  unsigned m = 0;  // no x86 vector compare: lane by lane
  for (int k = 0; k < Simd<T>::W; ++k) m |= unsigned(x[k] == y) << k;
  return m;
}

/// In-register transpose of a W × W block (r[i] = row i on entry, column i on
/// exit): log2(W) butterfly stages; stage H pairs rows i and i + H
/// ((i / H) even) and interleaves their H-element blocks.
template <class V, int W, int H, int... K>
inline V transpose_lo(V a, V b, std::integer_sequence<int, K...>) {
  return __builtin_shufflevector(a, b, (((K / H) % 2 == 0) ? K : W + K - H)...);
}
template <class V, int W, int H, int... K>
inline V transpose_hi(V a, V b, std::integer_sequence<int, K...>) {
  return __builtin_shufflevector(a, b, (((K / H) % 2 == 0) ? K + H : W + K)...);
}
template <class T, int H = 1>
inline void transpose_block(typename Simd<T>::v (&r)[Simd<T>::W]) {
  constexpr int W = Simd<T>::W;
  if constexpr (H < W) {
    using V = typename Simd<T>::v;
    constexpr auto idx = std::make_integer_sequence<int, W>{};
    for (int i = 0; i < W; ++i)
      if ((i / H) % 2 == 0) {
        const V lo = transpose_lo<V, W, H>(r[i], r[i + H], idx);
        const V hi = transpose_hi<V, W, H>(r[i], r[i + H], idx);
        r[i] = lo;
        r[i + H] = hi;
      }
    transpose_block<T, 2 * H>(r);
  }
}

/// Lane k of the result is x[(k + H) mod W].
template <class V, int H, int... K>
inline V rotate_lanes(V x, std::integer_sequence<int, K...>) {
  return __builtin_shufflevector(x, x, ((K + H) % int(sizeof...(K)))...);
}

/// Horizontal sum / max of a vector: log2(W) rotate-and-combine steps, a fixed
/// order of operations (the result depends on x only).
template <class T, int H = Simd<T>::W / 2>
inline T hsum(typename Simd<T>::v x) {
  if constexpr (H == 0) {
    return x[0];
  } else {
    x += rotate_lanes<typename Simd<T>::v, H>(x, std::make_integer_sequence<int, Simd<T>::W>{});
    return hsum<T, H / 2>(x);
  }
}
template <class T, int H = Simd<T>::W / 2>
inline T hmax(typename Simd<T>::v x) {
  if constexpr (H == 0) {
    return x[0];
  } else {
    const typename Simd<T>::v y = rotate_lanes<typename Simd<T>::v, H>(x, std::make_integer_sequence<int, Simd<T>::W>{});
    return hmax<T, H / 2>(y > x ? y : x);
  }
}
#endif

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
