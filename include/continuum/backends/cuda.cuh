// backends/cuda.cuh — the CUDA backend, chosen at compile time by the backend
// tag (backends/backend.hpp). Include it from a .cu file compiled by
// nvcc and link the target continuum::cuda (which defines CONTINUUM_WITH_CUDA):
//
//   #include <continuum/backends/cuda.cuh>
//   continuum::attention_forward(continuum::cuda, args);   // args hold device pointers
//   continuum::attention_backward(continuum::cuda, bargs);
//
// Storage types: float, __half, __nv_bfloat16; accumulation in float
// (accum_t<__half> = accum_t<__nv_bfloat16> = float, so lse, the temperature
// and dτ are float arrays). Kernels: continuum, softmax, focal (= softmax with
// the given temperature, MATH.md §8). head_dim and value dim ≤ 256. The per-element
// math is math/density.hpp's ContinuumStencil / SoftmaxStencil, the same
// templates the CPU backend uses. Launches are asynchronous on the default
// stream. Not supported here: the probs / cell_mass inspection outputs (CPU only).
// Device-resident arrays (explicit ranges, per-head / per-query temperature)
// are validated by a check kernel whose result the host waits for (one sync
// per call that has such arrays; CONTINUUM_CUDA_UNCHECKED_DEVICE_ARRAYS skips
// it), see launch.cuh check_device_arrays and docs/CUDA.md.
#pragma once

#if !defined(__CUDACC__)
#  error "continuum/backends/cuda.cuh must be compiled by nvcc (a .cu file)"
#endif

#include "../attention/params.hpp"
#include "../attention/validate.hpp"
#include "backend.hpp"
#include "cuda/launch.cuh"

namespace continuum {

#if defined(CONTINUUM_WITH_CUDA)

/// The CUDA implementation behind the continuum::cuda tag (the interface of
/// attention_impl<cpu_t>: validated shape and scale in, Stencil chosen by the
/// caller from args.kernel).
template <>
struct attention_impl<cuda_t> {
  template <class T, class Stencil>
  static void forward(const ForwardArgs<T>& args, const AttentionShape& shape, double scale) {
    cuda_detail::forward_launch<T, Stencil>(args, shape, scale);
  }
  template <class T, class Stencil>
  static void backward(const BackwardArgs<T>& args, const AttentionShape& shape, double scale) {
    cuda_detail::backward_launch<T, Stencil>(args, shape, scale);
  }
};

/// Forward on the GPU (MATH.md §4–§5); `args` hold device pointers. Same contract
/// as attention/forward.hpp's attention_forward, except: T is float, __half or
/// __nv_bfloat16 (fp32 accumulation; lse and the temperature are float for the
/// 16-bit types; the kernel bodies also take double, which only their host
/// emulation, tests/cuda, runs); head_dim, Dv ≤ 256; probs / cell_mass must be
/// null; compute float64 is CPU-only (std::invalid_argument). The
/// values of device arrays (per-head / per-query τ: finite, > 0, scale/τ
/// finite in fp32; explicit ranges: 0 ≤ lo ≤ hi ≤ Lk) are checked by a small
/// kernel and the call then waits for the default stream; without such
/// arrays it is asynchronous on the default stream.
/// \throws std::invalid_argument on bad shapes or values (the CPU backend's
///         messages), std::runtime_error on CUDA errors.
template <class T>
void attention_forward(cuda_t, const ForwardArgs<T>& args) {
  double scale = 1.0;
  const AttentionShape shape = cuda_detail::validate_forward_device(args, &scale);
  if (args.kernel == Kernel::continuum)
    attention_impl<cuda_t>::forward<T, ContinuumStencil>(args, shape, scale);
  else
    attention_impl<cuda_t>::forward<T, SoftmaxStencil>(args, shape, scale);
}

/// Backward on the GPU (MATH.md §6): dQ, dK, dV, dτ; deterministic (no atomics).
/// Same contract, checks and exceptions as the forward above. As in the CPU
/// backend, `out` and `lse` are shape-checked but not read (lse may be null):
/// each row's maximum and Z are recomputed and Dl is formed from P and dP
/// relative to the row's first maximal key, not as dO·o (tiny τ, bug case W12).
/// fp32 range limit: where a row's score gaps around its maximum exceed ~1e19
/// (e.g. τ < 1e-19 with O(1) gaps), that row's dQ, dK, dτ flush to 0.
template <class T>
void attention_backward(cuda_t, const BackwardArgs<T>& args) {
  double scale = 1.0;
  const AttentionShape shape = cuda_detail::validate_backward_device(args, &scale);
  if (args.kernel == Kernel::continuum)
    attention_impl<cuda_t>::backward<T, ContinuumStencil>(args, shape, scale);
  else
    attention_impl<cuda_t>::backward<T, SoftmaxStencil>(args, shape, scale);
}

#endif  // CONTINUUM_WITH_CUDA

}  // namespace continuum
