// backends/cuda/common.cuh — what the CUDA kernels share: the device-side
// parameter block, visibility and temperature per query row, storage/accumulator
// conversions, the shared-memory carving, and the thread/block accessors.
//
// The kernel bodies (forward.cuh, backward.cuh) are written against the
// accessors thread_id(), block_threads(), block_id(), grid_blocks(),
// block_sync() and shared_bytes() only (no warp intrinsics, no atomics), so the
// same bodies also run in tests/cuda/emulate.hpp, which executes a "block" as
// host threads with a barrier. That is how this backend's index arithmetic is
// tested on machines without a GPU (SPEC §7.10: any tiling gives the same
// result within rounding).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../../attention/params.hpp"
#include "../../attention/visibility.hpp"
#include "../../config.hpp"
#include "../../math/density.hpp"

#if defined(__CUDACC__)
#  include <cuda_bf16.h>
#  include <cuda_fp16.h>
#  define CONTINUUM_DEVICE __device__
#elif defined(CONTINUUM_CUDA_EMULATE)
#  define CONTINUUM_DEVICE
#else
#  error "continuum/backends/cuda/*.cuh must be compiled by nvcc (include <continuum/backends/cuda.cuh> from a .cu file)"
#endif

namespace continuum {

#if defined(__CUDACC__)
/// 16-bit storage accumulates in float (config.hpp's accum).
template <> struct accum<__half> { using type = float; };
template <> struct accum<__nv_bfloat16> { using type = float; };
#endif

namespace cuda_detail {

#if defined(__CUDACC__)
CONTINUUM_DEVICE inline int thread_id() { return static_cast<int>(threadIdx.x); }
CONTINUUM_DEVICE inline int block_threads() { return static_cast<int>(blockDim.x); }
CONTINUUM_DEVICE inline index_t block_id() { return static_cast<index_t>(blockIdx.x); }
CONTINUUM_DEVICE inline index_t grid_blocks() { return static_cast<index_t>(gridDim.x); }
CONTINUUM_DEVICE inline void block_sync() { __syncthreads(); }
CONTINUUM_DEVICE inline unsigned char* shared_bytes() {
  extern __shared__ __align__(16) unsigned char continuum_shared[];
  return continuum_shared;
}
#endif
// In emulation, tests/cuda/emulate.hpp defines the same six functions first.

/// Storage → accumulator.
CONTINUUM_HOST_DEVICE inline float to_acc(float x) { return x; }
CONTINUUM_HOST_DEVICE inline double to_acc(double x) { return x; }
#if defined(__CUDACC__)
CONTINUUM_HOST_DEVICE inline float to_acc(__half x) { return __half2float(x); }
CONTINUUM_HOST_DEVICE inline float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }
#endif

/// Accumulator → storage, rounding to nearest even.
template <class E> struct storage;
template <> struct storage<float> {
  CONTINUUM_HOST_DEVICE static float from(float x) { return x; }
};
template <> struct storage<double> {
  CONTINUUM_HOST_DEVICE static double from(double x) { return x; }
};
#if defined(__CUDACC__)
template <> struct storage<__half> {
  CONTINUUM_HOST_DEVICE static __half from(float x) { return __float2half_rn(x); }
};
template <> struct storage<__nv_bfloat16> {
  CONTINUUM_HOST_DEVICE static __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
};
#endif

template <class A> CONTINUUM_HOST_DEVICE constexpr A neg_inf() { return -A(__builtin_huge_val()); }

/// |lse| above which the backward does not trust P = α(s − lse): lse = m + log l
/// rounded to A loses log l's low bits once ulp(lse) is no longer small against
/// 1 (ulp(16) = 2^-19 in float, 2^-48 in double; at lse ~ 2e38, bug case W13,
/// log l vanishes entirely). Such rows get m and l recomputed (backward.cuh).
inline constexpr double lse_trust_limit = 16.0;

/// Everything a kernel reads, in one trivially copyable block (flash-attention's
/// Flash_fwd_params). E = storage type, A = accumulator type. The views hold
/// device pointers; strides are in elements, the last dimension contiguous.
template <class E, class A>
struct KernelParams {
  TensorView<const E> q, k, v;   // [B,Hq,Lq,D], [B,Hk,Lk,D], [B,Hk,Lk,Dv]
  TensorView<const E> o, dout;   // backward: forward output and dO, [B,Hq,Lq,Dv]
  TensorView<E> out;             // forward output
  TensorView<E> dq, dk, dv;      // backward outputs (data may be null)
  A* lse_out = nullptr;          // forward: [B,Hq,Lq] or null
  const A* lse_in = nullptr;     // backward
  A* row_delta = nullptr;        // backward workspace D_i = dO_i·o_i, [B,Hq,Lq]
  A* row_dtau = nullptr;         // backward workspace -(1/τ_i) Σ_j dS_ij s_ij, or null
  A* row_shift = nullptr;        // backward workspace: P_ij = α(s_ij - shift_i) / norm_i
  A* row_norm = nullptr;         //   (shift = lse, norm = 1; or m, l recomputed, see backward.cuh)
  index_t B = 0, Hq = 0, Hk = 0, Lq = 0, Lk = 0, D = 0, Dv = 0;
  A scale = A(1);                // softmax scale (τ not included)
  TemperatureShape tshape = TemperatureShape::scalar;
  A tvalue = A(1);
  const A* tdata = nullptr;
  Visibility vis{};              // ranges (if any) are device arrays [B, Lq]
  int bm = 64, bn = 64;          // query / key tile sizes (runtime: one instantiation per type)
};

/// Visible key range [lo, hi) of query i of batch item b: the shared
/// attention/visibility.hpp rule (SPEC §3), the same function the CPU backend
/// uses. Empty ranges come back as lo == hi.
template <class E, class A>
CONTINUUM_HOST_DEVICE inline void visible_range(const KernelParams<E, A>& p, index_t b, index_t i,
                                                index_t& lo, index_t& hi) {
  const KeyRange r = continuum::visible_range(p.vis, b, i, p.Lq, p.Lk);
  lo = r.lo;
  hi = r.hi;
}

/// τ of query i of (batch b, query head h) (SPEC §8 shapes).
template <class E, class A>
CONTINUUM_HOST_DEVICE inline A temperature_of(const KernelParams<E, A>& p, index_t b, index_t h,
                                              index_t i) {
  switch (p.tshape) {
    case TemperatureShape::per_head: return p.tdata[h];
    case TemperatureShape::per_query: return p.tdata[(b * p.Hq + h) * p.Lq + i];
    default: return p.tvalue;
  }
}

/// Shared-memory carving: the same code sizes the buffer on the host (base =
/// nullptr) and hands out the pointers on the device; every region 16-byte aligned.
struct Carve {
  unsigned char* base;
  std::size_t used = 0;
  template <class T>
  CONTINUUM_HOST_DEVICE T* take(index_t n) {
    used = (used + 15) & ~std::size_t(15);
    T* r = base == nullptr ? nullptr : reinterpret_cast<T*>(base + used);
    used += static_cast<std::size_t>(n) * sizeof(T);
    return r;
  }
};

/// Threads per block of every attention kernel (and of the emulator's blocks
/// unless a test picks fewer).
inline constexpr int block_size = 128;

}  // namespace cuda_detail
}  // namespace continuum
