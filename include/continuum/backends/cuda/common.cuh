// backends/cuda/common.cuh — what the CUDA kernels share: the device-side
// parameter block, visibility and temperature per query row, storage/accumulator
// conversions, the shared-memory carving, and the thread/block accessors.
//
// The kernel bodies (forward.cuh, backward.cuh) are written against the
// accessors thread_id(), block_threads(), block_id(), grid_blocks(),
// block_sync() and shared_bytes() only (no warp intrinsics, no atomics), so the
// same bodies also run in tests/cuda/emulate.hpp, which executes a "block" as
// host threads with a barrier. That is how this backend's index arithmetic is
// tested on machines without a GPU (MATH.md §7.10: any tiling gives the same
// result within rounding).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../../attention/params.hpp"
#include "../../attention/visibility.hpp"
#include "../../config.hpp"
#include "../row_state.hpp"
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

/// Everything a kernel reads, in one trivially copyable block (flash-attention's
/// Flash_fwd_params). E = storage type, A = accumulator type. The views hold
/// device pointers; strides are in elements, the last dimension contiguous.
template <class E, class A>
struct KernelParams {
  TensorView<const E> q, k, v;   // [B,Hq,Lq,D], [B,Hk,Lk,D], [B,Hk,Lk,Dv]
  TensorView<const E> dout;      // backward: dO, [B,Hq,Lq,Dv]
  TensorView<E> out;             // forward output
  TensorView<E> dq, dk, dv;      // backward outputs (data may be null)
  A* lse_out = nullptr;          // forward: [B,Hq,Lq] or null
  // Backward row statistics, [B,Hq,Lq] each (backward.cuh, row_stats_body):
  // P_ij = α(s_ij - shift_i) / norm_i with shift = the row's maximum score and
  // norm = Σ_j α(s_ij - shift_i); ref = the row's reference key (its first key
  // at the maximum, -1 if none), dpref = dP at ref, dl = Dl - dP_ref =
  // Σ_j P_ij (dP_ij - dP_ref), dsref = dS at ref.
  A* row_shift = nullptr;
  A* row_norm = nullptr;
  index_t* row_ref = nullptr;
  A* row_dpref = nullptr;
  A* row_dl = nullptr;
  A* row_dsref = nullptr;
  A* row_dtau = nullptr;         // -(1/τ_i) Σ_j dS_ij s_ij, or null
  index_t B = 0, Hq = 0, Hk = 0, Lq = 0, Lk = 0, D = 0, Dv = 0;
  A scale = A(1);                // softmax scale (τ not included)
  TemperatureShape tshape = TemperatureShape::scalar;
  A tvalue = A(1);
  const A* tdata = nullptr;
  Visibility vis{};              // ranges (if any) are device arrays [B, Lq]
  int bm = 64, bn = 64;          // query / key tile sizes (runtime: one instantiation per type)
};

/// Visible key range [lo, hi) of query i of batch item b: the shared
/// attention/visibility.hpp rule (MATH.md §3), the same function the CPU backend
/// uses. Empty ranges come back as lo == hi.
template <class E, class A>
CONTINUUM_HOST_DEVICE inline void visible_range(const KernelParams<E, A>& p, index_t b, index_t i,
                                                index_t& lo, index_t& hi) {
  const KeyRange r = continuum::visible_range(p.vis, b, i, p.Lq, p.Lk);
  lo = r.lo;
  hi = r.hi;
}

/// τ of query i of (batch b, query head h): the shared lookup
/// (attention/params.hpp, temperature_at; MATH.md §8 shapes).
template <class E, class A>
CONTINUUM_HOST_DEVICE inline A temperature_of(const KernelParams<E, A>& p, index_t b, index_t h,
                                              index_t i) {
  return continuum::temperature_at(p.tshape, p.tvalue, p.tdata, b, h, i, p.Hq, p.Lq);
}

/// Visible key range [lo, hi) and score scale c = scale/τ of query row i of
/// (b, h); a row past Lq gets lo = hi = 0 and c = 0.
template <class E, class A>
CONTINUUM_HOST_DEVICE inline void query_row(const KernelParams<E, A>& p, index_t b, index_t h, index_t i,
                                            index_t& lo, index_t& hi, A& c) {
  lo = hi = 0;
  c = A(0);
  if (i < p.Lq) {
    visible_range(p, b, i, lo, hi);
    c = p.scale / temperature_of(p, b, h, i);
  }
}

/// The work items of the kernels that own query tiles (forward, row
/// statistics, dQ): (query tile, batch, query head), decoded from a flat
/// index of a grid-stride loop over [0, count).
struct QueryTiles {
  index_t n_qtiles, count, Hq, group, bm;
  template <class E, class A>
  CONTINUUM_HOST_DEVICE explicit QueryTiles(const KernelParams<E, A>& p)
      : n_qtiles((p.Lq + p.bm - 1) / p.bm), count(n_qtiles * p.B * p.Hq), Hq(p.Hq), group(p.Hq / p.Hk),
        bm(p.bm) {}
  struct Item {
    index_t b, h, hk, bh, i0;  // batch, query head, its kv head, b·Hq + h, first query row
  };
  CONTINUUM_HOST_DEVICE Item item(index_t work) const {
    const index_t bh = work / n_qtiles, h = bh % Hq;
    return {bh / Hq, h, h / group, bh, (work % n_qtiles) * bm};
  }
};

/// [kmin, kmax): the union of the non-empty key ranges [lo_r, hi_r) of a
/// block's bm rows (kmin = Lk, kmax = 0 if all are empty). Thread 0 writes it
/// to krange[0..1]; the caller syncs before reading.
CONTINUUM_DEVICE inline void block_key_range(const index_t* lo, const index_t* hi, int bm, index_t Lk,
                                             index_t* krange) {
  if (thread_id() != 0) return;
  index_t kmin = Lk, kmax = 0;
  for (int r = 0; r < bm; ++r) {
    if (lo[r] < hi[r]) {
      kmin = math::min(kmin, lo[r]);
      kmax = math::max(kmax, hi[r]);
    }
  }
  krange[0] = kmin;
  krange[1] = kmax;
}

/// q tile of query rows i0 .. i0+bm-1 of (b, h), row r scaled by c[r] = scale/τ
/// (c folded into q before any dot product, bug case W13); zeros past Lq.
template <class E, class A>
CONTINUUM_DEVICE void load_scaled_query(const KernelParams<E, A>& p, const A* c, A* q, index_t ldq,
                                        index_t b, index_t h, index_t i0, int bm) {
  for (index_t x = thread_id(); x < bm * p.D; x += block_threads()) {
    const index_t r = x / p.D, d = x % p.D, i = i0 + r;
    q[r * ldq + d] = i < p.Lq ? c[r] * to_acc(p.q.row(b, h, i)[d]) : A(0);
  }
}

/// Rows n0-1 .. n0+bn of `t` (the tile plus its one-row halo on each side,
/// zeros outside [0, Lk)) of kv head hk into `dst`, row stride ld.
template <class E, class A>
CONTINUUM_DEVICE void load_haloed_rows(const KernelParams<E, A>& p, const TensorView<const E>& t, A* dst,
                                       index_t ld, index_t b, index_t hk, index_t n0, int bn) {
  const index_t n = (bn + 2) * t.dim;
  for (index_t x = thread_id(); x < n; x += block_threads()) {
    const index_t cc = x / t.dim, d = x % t.dim, j = n0 - 1 + cc;
    dst[cc * ld + d] = (j >= 0 && j < p.Lk) ? to_acc(t.row(b, hk, j)[d]) : A(0);
  }
}

/// Scores s = (c q)·k of a bm × (bn+2) tile (key columns n0-1 .. n0+bn): q and
/// k as loaded above; entries outside a row's [lo, hi) get -inf.
template <class A>
CONTINUUM_DEVICE void tile_scores(const A* q, index_t ldq, const A* k, index_t ldk, index_t D,
                                  const index_t* lo, const index_t* hi, index_t n0, int bm, int bn,
                                  A* s) {
  const index_t w = bn + 2;
  for (index_t x = thread_id(); x < bm * w; x += block_threads()) {
    const index_t r = x / w, cc = x % w, j = n0 - 1 + cc;
    A v = neg_inf<A>();
    if (j >= lo[r] && j < hi[r]) {
      const A* qr = q + r * ldq;
      const A* kr = k + cc * ldk;
      A acc = A(0);
      for (index_t d = 0; d < D; ++d) acc += qr[d] * kr[d];
      v = acc;
    }
    s[x] = v;
  }
}

/// α(s − m_r) of the bn interior columns n0 .. n0+bn-1 of a score tile left by
/// tile_scores, with the shared stencil of math/density.hpp (MATH.md §4): each
/// row r shifted by m[r]; 0 outside the row's range.
template <class A, class Stencil>
CONTINUUM_DEVICE void tile_weights(const A* s, const A* m, const index_t* lo, const index_t* hi, index_t n0,
                                   int bm, int bn, A* alpha) {
  const index_t w = bn + 2;
  for (index_t x = thread_id(); x < bm * bn; x += block_threads()) {
    const index_t r = x / bn, jj = x % bn, j = n0 + jj;
    A a = A(0);
    if (j >= lo[r] && j < hi[r]) {
      const A* sr = s + r * w + jj;  // sr[0] = s_{j-1}, sr[1] = s_j, sr[2] = s_{j+1}
      a = Stencil::weight(sr[0] - m[r], sr[1] - m[r], sr[2] - m[r], j - 1 >= lo[r], j + 1 < hi[r]);
    }
    alpha[x] = a;
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
