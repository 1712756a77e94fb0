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
#include <vector>

#include <cuda_runtime.h>

#include "arguments.cuh"
#include "backward.cuh"
#include "common.cuh"
#include "forward.cuh"

namespace continuum {
namespace cuda_detail {

template <class E, class A, class Stencil>
__global__ void forward_kernel(const KernelParams<E, A> p) { forward_body<E, A, Stencil>(p); }
template <class E, class A, class Stencil>
__global__ void row_stats_kernel(const KernelParams<E, A> p) { row_stats_body<E, A, Stencil>(p); }
template <class E, class A, class Stencil>
__global__ void dq_kernel(const KernelParams<E, A> p) { dq_body<E, A, Stencil>(p); }
template <class E, class A, class Stencil>
__global__ void dkdv_kernel(const KernelParams<E, A> p) { dkdv_body<E, A, Stencil>(p); }
template <class A>
__global__ void device_check_kernel(const DeviceArrays<A> d, int* flags) { device_array_check_body<A>(d, flags); }
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

/// Checks the values of the device arrays among the arguments (per-head /
/// per-query temperature, explicit ranges; arguments.cuh) before any attention
/// kernel runs: one small kernel, then its flags are copied back, which waits
/// for the default stream. Nothing is launched when the arguments hold no
/// device array. Defining CONTINUUM_CUDA_UNCHECKED_DEVICE_ARRAYS skips the
/// check (and the wait); bad values are then not reported.
/// \throws std::invalid_argument naming the first bad element, as the CPU backend does.
template <class A, class Args>
void check_device_arrays(const char* fn, const Args& a, const AttentionShape& s, double scale) {
#if defined(CONTINUUM_CUDA_UNCHECKED_DEVICE_ARRAYS)
  (void)fn, (void)a, (void)s, (void)scale;
#else
  const DeviceArrays<A> d = device_arrays<A>(a, s, scale);
  if (d.count() == 0) return;
  constexpr int threads = 256;
  const index_t blocks = device_check_blocks(d.count(), threads);
  int* flags_dev = nullptr;
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&flags_dev), sizeof(int) * 2 * blocks, 0), "cudaMallocAsync");
  device_check_kernel<A><<<unsigned(blocks), threads, 2 * threads * sizeof(int)>>>(d, flags_dev);
  check_cuda(cudaGetLastError(), "argument check kernel launch");
  std::vector<int> flags(static_cast<std::size_t>(2 * blocks));
  const cudaError_t copied = cudaMemcpy(flags.data(), flags_dev, sizeof(int) * flags.size(), cudaMemcpyDeviceToHost);
  check_cuda(cudaFreeAsync(flags_dev, 0), "cudaFreeAsync");
  check_cuda(copied, "cudaMemcpy (argument check flags)");
  report_device_arrays(fn, flags, a.temperature, a.visibility, s, d, scale,
                       [](void* dst, const void* src, std::size_t bytes) {
                         check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
                       });
#endif
}

template <class E, class Stencil>
void forward_launch(const ForwardArgs<E>& a, const AttentionShape& shape, double scale) {
  using A = accum_t<E>;
  check_device_arrays<A>("attention_forward(cuda)", a, shape, scale);
  KernelParams<E, A> p = make_params<E, A>(a, shape, scale);
  p.out = a.out;
  p.lse_out = a.lse;
  if (p.B == 0 || p.Hq == 0 || p.Lq == 0) return;
  std::size_t bytes = 0;
  choose_tiles([&](int bm, int bn) { return ForwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv); },
               p.bm, p.bn, bytes);
  auto kern = forward_kernel<E, A, Stencil>;
  set_smem(kern, bytes);
  const index_t work = ((p.Lq + p.bm - 1) / p.bm) * p.B * p.Hq;
  kern<<<grid_for(work), block_size, bytes>>>(p);
  check_cuda(cudaGetLastError(), "forward kernel launch");
}

template <class E, class Stencil>
void backward_launch(const BackwardArgs<E>& a, const AttentionShape& shape, double scale) {
  using A = accum_t<E>;
  const index_t B = shape.batch, Hq = shape.heads_q, Lq = shape.len_q;
  check_device_arrays<A>("attention_backward(cuda)", a, shape, scale);
  KernelParams<E, A> p = make_params<E, A>(a, shape, scale);
  p.dout = a.grad_out;
  p.dq = a.grad_query;
  p.dk = a.grad_key;
  p.dv = a.grad_value;
  const bool want_dtau = a.grad_temperature != nullptr;
  if (p.B == 0 || p.Hq == 0 || p.Lq == 0 || p.Lk == 0) {
    // Nothing visible anywhere: every gradient is zero (MATH.md §3).
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
  // Workspace: the row statistics (common.cuh KernelParams), [B, Hq, Lq] each.
  const index_t rows = p.B * p.Hq * p.Lq;
  void* ws = nullptr;
  check_cuda(cudaMallocAsync(&ws, (sizeof(index_t) + 6 * sizeof(A)) * rows, 0), "cudaMallocAsync");
  p.row_ref = static_cast<index_t*>(ws);
  A* wa = reinterpret_cast<A*>(p.row_ref + rows);
  p.row_shift = wa;
  p.row_norm = wa + rows;
  p.row_dpref = wa + 2 * rows;
  p.row_dl = wa + 3 * rows;
  p.row_dsref = wa + 4 * rows;
  p.row_dtau = want_dtau ? wa + 5 * rows : nullptr;
  if (want_dtau && p.tshape == TemperatureShape::per_query) p.row_dtau = a.grad_temperature;

  using Role = typename BackwardShared<A>::Role;
  std::size_t bytes = 0;
  int bm = 0, bn = 0;
  choose_tiles([&](int m, int n) { return BackwardShared<A>::carve(nullptr, nullptr, m, n, p.D, p.Dv, Role::key); },
               bm, bn, bytes);
  p.bm = bm;
  p.bn = bn;
  const unsigned q_grid = grid_for(((p.Lq + bm - 1) / bm) * p.B * p.Hq);
  {  // 1. row statistics (the D pass): m, Z̃, ref, dP_ref, Dl − dP_ref, dS_ref
    auto kern = row_stats_kernel<E, A, Stencil>;
    const std::size_t b1 = BackwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv, Role::row_stats);
    set_smem(kern, b1);
    kern<<<q_grid, block_size, b1>>>(p);
    check_cuda(cudaGetLastError(), "row statistics kernel launch");
  }
  if (p.dq.data != nullptr || want_dtau) {
    auto kern = dq_kernel<E, A, Stencil>;
    const std::size_t b2 = BackwardShared<A>::carve(nullptr, nullptr, bm, bn, p.D, p.Dv, Role::query);
    set_smem(kern, b2);
    kern<<<q_grid, block_size, b2>>>(p);
    check_cuda(cudaGetLastError(), "dq kernel launch");
  }
  if (p.dk.data != nullptr || p.dv.data != nullptr) {
    auto kern = dkdv_kernel<E, A, Stencil>;
    set_smem(kern, bytes);
    kern<<<grid_for(((p.Lk + bn - 1) / bn) * p.B * p.Hk), block_size, bytes>>>(p);
    check_cuda(cudaGetLastError(), "dkdv kernel launch");
  }
  if (want_dtau && p.tshape != TemperatureShape::per_query) {
    const detail::GradTemperatureOrder order{p.tshape, p.B, p.Hq, p.Lq};
    constexpr int lanes = detail::GradTemperatureOrder::kLanes;
    dtau_kernel<E, A><<<grid_for(order.outputs()), lanes, lanes * sizeof(A)>>>(p, a.grad_temperature);
    check_cuda(cudaGetLastError(), "dtau kernel launch");
  }
  check_cuda(cudaFreeAsync(ws, 0), "cudaFreeAsync");
}

}  // namespace cuda_detail
}  // namespace continuum
