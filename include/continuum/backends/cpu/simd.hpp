// backends/cpu/simd.hpp — the one place that picks the CPU vector width for the
// tiled kernels. GCC/Clang vector extensions give portable vector code: the
// compiler emits AVX-512, AVX or SSE for the same source depending on -march.
// Other compilers get the scalar loops (CONTINUUM_CPU_SIMD undefined).
#pragma once

#include <cstdint>

#if (defined(__GNUC__) || defined(__clang__)) && !defined(CONTINUUM_NO_CPU_SIMD)
#  define CONTINUUM_CPU_SIMD 1
#  if defined(__AVX512F__)
#    include <immintrin.h>
#  endif
#endif

namespace continuum {
namespace cpu_detail {

#if defined(CONTINUUM_CPU_SIMD)
#  if defined(__AVX512F__)
inline constexpr int kSimdBytes = 64;
#  elif defined(__AVX__)
inline constexpr int kSimdBytes = 32;
#  else
inline constexpr int kSimdBytes = 16;
#  endif

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
};
#endif

}  // namespace cpu_detail
}  // namespace continuum
