// backends/cuda/launch.cuh — host side of the CUDA backend: argument checks,
// the kernel parameter block, tile choice, launches, workspace.
//
// Launches go to the legacy default stream and are asynchronous like every
// CUDA kernel; call cudaDeviceSynchronize (or an event) before reading the
// outputs on the host. CUDA errors become std::runtime_error naming the call.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "arguments.cuh"
#include "backward.cuh"
#include "common.cuh"
#include "forward.cuh"

namespace continuum {
namespace cuda_detail {

template <class E, class A, class Stencil, bool Stats>
__global__ void forward_kernel(const KernelParams<E, A> p) { forward_body<E, A, Stencil, Stats>(p); }
template <class E, class A>
__global__ void delta_kernel(const KernelParams<E, A> p) { delta_body<E, A>(p); }
template <class E, class A, class Stencil>
__global__ void dq_kernel(const KernelParams<E, A> p) { dq_body<E, A, Stencil>(p); }
template <class E, class A, class Stencil>
__global__ void dkdv_kernel(const KernelParams<E, A> p) { dkdv_body<E, A, Stencil>(p); }
template <class E, class A>
__global__ void dtau_kernel(const KernelParams<E, A> p, A* grad) { dtau_body<E, A>(p, grad); }

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("continuum cuda backend: ") + what + ": " +
                             cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

/// Largest (bm, bn) whose shared memory fits the device's opt-in limit.
template <class SizeFn>
void choose_tiles(SizeFn bytes_for, int& bm, int& bn, std::size_t& bytes) {
  int dev = 0, optin = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
             "cudaDeviceGetAttribute");
  static constexpr int cand[][2] = {{64, 64}, {64, 32}, {32, 32}, {32, 16}, {16, 16}, {8, 8}};
  for (const auto& c : cand) {
    bytes = bytes_for(c[0], c[1]);
    if (bytes <= static_cast<std::size_t>(optin)) {
      bm = c[0];
      bn = c[1];
      return;
    }
  }
  detail::fail("attention (cuda)", "head_dim too large for this device's shared memory");
}

inline unsigned grid_for(index_t work) {
  const index_t cap = index_t(1) << 30;
  return static_cast<unsigned>(work < 1 ? 1 : (work < cap ? work : cap));
}

template <class Kern>
void set_smem(Kern k, std::size_t bytes) {
  check_cuda(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
             "cudaFuncSetAttribute");
}

template <class E, class Stencil>
void forward_launch(const ForwardArgs<E>& a, const AttentionShape& shape, double scale) {
  using A = accum_t<E>;
  KernelParams<E, A> p = make_params<E, A>(a, shape, scale);
  p.out = a.out;
  p.lse_out = a.lse;
  if (p.B == 0 || p.Hq == 0 || p.Lq == 0) return;
  std::size_t bytes = 0;
  choose_tiles([&](int bm, int bn) { return ForwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv); },
               p.bm, p.bn, bytes);
  auto kern = forward_kernel<E, A, Stencil, false>;
  set_smem(kern, bytes);
  const index_t work = ((p.Lq + p.bm - 1) / p.bm) * p.B * p.Hq;
  kern<<<grid_for(work), block_size, bytes>>>(p);
  check_cuda(cudaGetLastError(), "forward kernel launch");
}

template <class E, class Stencil>
void backward_launch(const BackwardArgs<E>& a, const AttentionShape& shape, double scale) {
  using A = accum_t<E>;
  const index_t B = shape.batch, Hq = shape.heads_q, Lq = shape.len_q;
  KernelParams<E, A> p = make_params<E, A>(a, shape, scale);
  p.o = a.out;
  p.dout = a.grad_out;
  p.lse_in = a.lse;
  p.dq = a.grad_query;
  p.dk = a.grad_key;
  p.dv = a.grad_value;
  const bool want_dtau = a.grad_temperature != nullptr;
  if (p.B == 0 || p.Hq == 0 || p.Lq == 0 || p.Lk == 0) {
    // Nothing visible anywhere: every gradient is zero (SPEC §3).
    auto zero = [](auto& view) {
      using V = std::remove_reference_t<decltype(*view.data)>;
      for (index_t b = 0; b < view.batch; ++b)
        for (index_t h = 0; h < view.heads; ++h)
          for (index_t s = 0; s < view.seq; ++s)
            check_cuda(cudaMemset(view.row(b, h, s), 0, sizeof(V) * view.dim), "cudaMemset");
    };
    if (p.dq.data) zero(p.dq);
    if (p.dk.data) zero(p.dk);
    if (p.dv.data) zero(p.dv);
    if (want_dtau) {
      const index_t n = p.tshape == TemperatureShape::scalar ? 1
                        : p.tshape == TemperatureShape::per_head ? Hq : B * Hq * Lq;
      check_cuda(cudaMemset(a.grad_temperature, 0, sizeof(A) * n), "cudaMemset");
    }
    return;
  }
  const index_t rows = p.B * p.Hq * p.Lq;
  A* ws = nullptr;
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&ws), sizeof(A) * rows * 4, 0),
             "cudaMallocAsync");
  p.row_delta = ws;
  p.row_shift = ws + rows;
  p.row_norm = ws + 2 * rows;
  p.row_dtau = want_dtau ? ws + 3 * rows : nullptr;
  if (want_dtau && p.tshape == TemperatureShape::per_query) p.row_dtau = a.grad_temperature;

  delta_kernel<E, A><<<grid_for((rows + block_size - 1) / block_size), block_size>>>(p);
  check_cuda(cudaGetLastError(), "delta kernel launch");
  {  // row statistics: shift/norm of P (exact m, l where |lse| is too large to trust)
    std::size_t fbytes = 0;
    KernelParams<E, A> ps = p;
    choose_tiles([&](int bm, int bn) { return ForwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv); },
                 ps.bm, ps.bn, fbytes);
    auto kern = forward_kernel<E, A, Stencil, true>;
    set_smem(kern, fbytes);
    kern<<<grid_for(((p.Lq + ps.bm - 1) / ps.bm) * p.B * p.Hq), block_size, fbytes>>>(ps);
    check_cuda(cudaGetLastError(), "row statistics kernel launch");
  }

  std::size_t bytes = 0;
  int bm = 0, bn = 0;
  choose_tiles([&](int m, int n) {
    return BackwardShared<A>::carve(nullptr, nullptr, m, n, p.D, p.Dv, true); }, bm, bn, bytes);
  p.bm = bm;
  p.bn = bn;
  if (p.dq.data != nullptr || want_dtau) {
    auto kern = dq_kernel<E, A, Stencil>;
    const std::size_t b2 = BackwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv, false);
    set_smem(kern, b2);
    kern<<<grid_for(((p.Lq + bm - 1) / bm) * p.B * p.Hq), block_size, b2>>>(p);
    check_cuda(cudaGetLastError(), "dq kernel launch");
  }
  if (p.dk.data != nullptr || p.dv.data != nullptr) {
    auto kern = dkdv_kernel<E, A, Stencil>;
    set_smem(kern, bytes);
    kern<<<grid_for(((p.Lk + bn - 1) / bn) * p.B * p.Hk), block_size, bytes>>>(p);
    check_cuda(cudaGetLastError(), "dkdv kernel launch");
  }
  if (want_dtau && p.tshape != TemperatureShape::per_query) {
    const index_t n_out = p.tshape == TemperatureShape::per_head ? p.Hq : 1;
    dtau_kernel<E, A><<<grid_for(n_out), 256, 256 * sizeof(A)>>>(p, a.grad_temperature);
    check_cuda(cudaGetLastError(), "dtau kernel launch");
  }
  check_cuda(cudaFreeAsync(ws, 0), "cudaFreeAsync");
}

}  // namespace cuda_detail
}  // namespace continuum
