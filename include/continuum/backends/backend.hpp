// backends/backend.hpp — compile-time backend selection (after thrust's
// device_system): a tag picks the implementation at the call site.
#pragma once

namespace continuum {

/// The CPU backend (backends/cpu.hpp; always available): pass `continuum::cpu`
/// as attention_forward / attention_backward's first argument.
struct cpu_t {};
inline constexpr cpu_t cpu{};
/// The CUDA backend (backends/cuda.cuh, docs/CUDA.md; include it from a .cu
/// file compiled by nvcc): pass `continuum::cuda`; device pointers.
struct cuda_t {};
inline constexpr cuda_t cuda{};

/// Specialised in backends/<name>/. attention_impl<cuda_t> exists only when
/// CONTINUUM_WITH_CUDA is defined and the file is compiled by nvcc.
template <class Backend>
struct attention_impl {
  static_assert(sizeof(Backend) == 0,
                "continuum: this backend is not available in this build. The CUDA backend "
                "needs CONTINUUM_ENABLE_CUDA=ON, the target continuum::cuda, "
                "#include <continuum/backends/cuda.cuh>, and a .cu file compiled by nvcc.");
};

}  // namespace continuum
