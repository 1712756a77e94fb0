// continuum — Continuum Attention, a header-only C++17 library.
// config.hpp: version, host/device macros, the math shim, accumulation types.
// This is the one header that decides whether code is compiled by nvcc: the
// host/device macros below, and nothing else, tell the two compilers apart.
#pragma once

#include <cmath>
#include <cstdint>

#define CONTINUUM_VERSION_MAJOR 0
#define CONTINUUM_VERSION_MINOR 1
#define CONTINUUM_VERSION_PATCH 0

#if defined(__CUDACC__)
#  define CONTINUUM_HOST_DEVICE __host__ __device__
#else
#  define CONTINUUM_HOST_DEVICE
#endif
#if defined(__CUDA_ARCH__)
#  define CONTINUUM_DEVICE_PASS 1
#endif
/// Before a host-device function template that calls what it is given
/// (lambdas): each instantiation is compiled for the space its caller is in,
/// so nvcc's check of host-only callees is disabled for it (as in Eigen).
#if defined(__CUDACC__)
#  define CONTINUUM_HD_CALLS_ARGUMENTS _Pragma("nv_exec_check_disable")
#else
#  define CONTINUUM_HD_CALLS_ARGUMENTS
#endif

namespace continuum {

inline constexpr int version_major = CONTINUUM_VERSION_MAJOR;
inline constexpr int version_minor = CONTINUUM_VERSION_MINOR;
inline constexpr int version_patch = CONTINUUM_VERSION_PATCH;

/// Accumulator type for a storage type (the element type stored and the type
/// sums are taken in are kept apart).
/// float accumulates in float, double in double; 16-bit types (CUDA, and the
/// CPU's bfloat16 and float16, backends/cpu/storage16.hpp) in float.
template <class T> struct accum { using type = T; };
template <class T> using accum_t = typename accum<T>::type;

/// Math shim: every math call in host/device code goes through here
/// (Eigen's EIGEN_USING_STD idea). On the host these are std::; in a CUDA
/// device pass they resolve to CUDA's overloads of the same names.
namespace math {
#if defined(CONTINUUM_DEVICE_PASS)
template <class T> CONTINUUM_HOST_DEVICE inline T exp(T x) { return ::exp(x); }
template <class T> CONTINUUM_HOST_DEVICE inline T expm1(T x) { return ::expm1(x); }
template <class T> CONTINUUM_HOST_DEVICE inline T fma(T x, T y, T z) { return ::fma(x, y, z); }
template <class T> CONTINUUM_HOST_DEVICE inline T log(T x) { return ::log(x); }
template <class T> CONTINUUM_HOST_DEVICE inline T abs(T x) { return ::fabs(x); }
template <class T> CONTINUUM_HOST_DEVICE inline bool isnan(T x) { return ::isnan(x); }
template <class T> CONTINUUM_HOST_DEVICE inline bool isfinite(T x) { return ::isfinite(x); }
#else
using std::exp;
using std::expm1;
using std::fma;
using std::log;
using std::abs;
using std::isnan;
using std::isfinite;
#endif
template <class T> CONTINUUM_HOST_DEVICE constexpr T max(T a, T b) { return a < b ? b : a; }
template <class T> CONTINUUM_HOST_DEVICE constexpr T min(T a, T b) { return b < a ? b : a; }
}  // namespace math

}  // namespace continuum
