// backends/cpu/storage16.hpp — 16-bit storage on the CPU (docs/MATH.md §10,
// "Compute type"): two storage types, both Eigen's and both with the bits of
// PyTorch's types of the same name:
//   continuum::bfloat16  1 sign, 8 exponent, 7 stored mantissa bits
//                        (torch.bfloat16; unit roundoff 2^-8);
//   continuum::float16   IEEE binary16: 1 sign, 5 exponent, 10 stored mantissa
//                        bits, largest finite 65504 (torch.float16; unit
//                        roundoff 2^-11).
// Both round from float to nearest even. Like the CUDA backend's 16-bit types
// they are storage only and accumulate in float: lse, the temperature and dτ
// are float (accum_t, config.hpp), and a call computes in float.
#pragma once

#include <type_traits>

#include <Eigen/Core>

#include "../../attention/params.hpp"
#include "../../config.hpp"
#include "isa.hpp"
#if defined(__SSE2__) || defined(__F16C__)
#  include <immintrin.h>
#endif

namespace continuum {

using bfloat16 = Eigen::bfloat16;
using float16 = Eigen::half;

template <>
struct accum<Eigen::bfloat16> {
  using type = float;
};
template <>
struct accum<Eigen::half> {
  using type = float;
};

/// Whether T is one of the 16-bit storage types (computed in float).
template <class T>
inline constexpr bool is_storage16_v = std::is_same<T, bfloat16>::value || std::is_same<T, float16>::value;

inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

/// dst[0, n) = src[0, n) converted: exact where it widens, to nearest even
/// where it narrows (float ↔ float16 eight at a time with F16C, which the
/// avx2 and avx512 kernels have; bfloat16 → float sixteen at a time with
/// AVX-512, eight with AVX2 or SSE2, which every x86-64 has: each 16-bit
/// pattern becomes the high half of a float whose low half is zero — the same
/// values as Eigen's scalar conversion, which does the rest, NaN payloads
/// included; a 16-bit call's conversions would otherwise cost as much as a
/// fifth of a forward, and a bfloat16 decode step widens its whole KV cache:
/// docs/PERFORMANCE.md). The floats are stored as wide as the kernels' vectors
/// read them back (add_scaled): a wider load of narrower stores waits for them
/// to reach the cache instead of being forwarded.
template <class D, class S>
inline void convert_n(const S* src, D* dst, index_t n) {
  index_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same<S, bfloat16>::value && std::is_same<D, float>::value)
    for (; i + 16 <= n; i += 16) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
    }
#elif defined(__AVX2__)
  if constexpr (std::is_same<S, bfloat16>::value && std::is_same<D, float>::value)
    for (; i + 8 <= n; i += 8) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
    }
#endif
#if defined(__SSE2__)
  if constexpr (std::is_same<S, bfloat16>::value && std::is_same<D, float>::value)
    for (; i + 8 <= n; i += 8) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)), zero = _mm_setzero_si128();
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm_unpacklo_epi16(zero, x));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 4), _mm_unpackhi_epi16(zero, x));
    }
#endif
#if defined(__F16C__)
  if constexpr (std::is_same<S, float16>::value && std::is_same<D, float>::value)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  if constexpr (std::is_same<S, float>::value && std::is_same<D, float16>::value)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) dst[i] = D(src[i]);
}

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
