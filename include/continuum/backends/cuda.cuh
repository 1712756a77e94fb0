// backends/cuda.cuh — the CUDA backend, chosen at compile time (STYLE.md
// "Backend selection at compile time"). Include it from a .cu file compiled by
// nvcc and link the target continuum::cuda (which defines CONTINUUM_WITH_CUDA):
//
//   #include <continuum/backends/cuda.cuh>
//   continuum::attention_forward(continuum::cuda, args);   // args hold device pointers
//   continuum::attention_backward(continuum::cuda, bargs);
//
// Storage types: float, __half, __nv_bfloat16; accumulation in float
// (accum_t<__half> = accum_t<__nv_bfloat16> = float, so lse, the temperature
// and dτ are float arrays). Kernels: continuum, softmax, focal (= softmax with
// the given temperature, SPEC §8). head_dim and value dim ≤ 256. The per-element
// math is math/density.hpp's ContinuumStencil / SoftmaxStencil, the same
// templates the CPU backend uses. Launches are asynchronous on the default
// stream. Not supported here: the probs / cell_mass inspection outputs (CPU only).
// Device-resident arrays (explicit ranges, per-head / per-query temperature)
// are not read on the host, so their values are not validated.
#pragma once

#if !defined(__CUDACC__)
#  error "continuum/backends/cuda.cuh must be compiled by nvcc (a .cu file)"
#endif

#include "../attention/params.hpp"
#include "backend.hpp"
#include "cuda/launch.cuh"

namespace continuum {

#if defined(CONTINUUM_WITH_CUDA)

/// The CUDA implementation behind the continuum::cuda tag.
template <>
struct attention_impl<cuda_t> {
  /// Forward (SPEC §4–§5). \throws std::invalid_argument on bad shapes,
  /// std::runtime_error on CUDA errors. Writes out and, if set, lse (float).
  template <class T>
  static void forward(const ForwardArgs<T>& a) {
    if (a.kernel == Kernel::continuum)
      cuda_detail::forward_launch<T, ContinuumStencil>(a);
    else
      cuda_detail::forward_launch<T, SoftmaxStencil>(a);
  }
  /// Backward (SPEC §6): dQ, dK, dV, dτ, deterministic (no atomics).
  template <class T>
  static void backward(const BackwardArgs<T>& a) {
    if (a.kernel == Kernel::continuum)
      cuda_detail::backward_launch<T, ContinuumStencil>(a);
    else
      cuda_detail::backward_launch<T, SoftmaxStencil>(a);
  }
};

/// attention_forward on the GPU; args hold device pointers.
template <class T>
void attention_forward(cuda_t, const ForwardArgs<T>& args) {
  attention_impl<cuda_t>::forward(args);
}
/// attention_backward on the GPU; args hold device pointers.
template <class T>
void attention_backward(cuda_t, const BackwardArgs<T>& args) {
  attention_impl<cuda_t>::backward(args);
}

#endif  // CONTINUUM_WITH_CUDA

}  // namespace continuum
