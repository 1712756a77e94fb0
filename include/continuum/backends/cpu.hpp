// backends/cpu.hpp — the CPU backend: attention_impl<cpu_t> (STYLE.md,
// "Backend selection at compile time").
#pragma once

#include <type_traits>

#include "backend.hpp"
#include "cpu/backward.hpp"
#include "cpu/flash.hpp"
#include "cpu/forward.hpp"

namespace continuum {

template <>
struct attention_impl<cpu_t> {
  template <class T, class Stencil>
  static void forward(const ForwardArgs<T>& args, const AttentionShape& shape, double scale) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                  "continuum CPU backend: T must be float or double");
    // The tiled kernels (cpu/flash.hpp) only when the caller opts in with
    // float_arithmetic and the inputs suit them; by default the exact
    // double-accumulating kernels, which every reference test exercises.
    if (args.float_arithmetic &&
        cpu_detail::flash::flash_forward<T, std::is_same<Stencil, ContinuumStencil>::value>(args, scale))
      return;
    cpu_detail::forward<T, Stencil>(args, shape, scale);
  }
  template <class T, class Stencil>
  static void backward(const BackwardArgs<T>& args, const AttentionShape& shape, double scale) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                  "continuum CPU backend: T must be float or double");
    if (args.float_arithmetic &&
        cpu_detail::flash::flash_backward<T, std::is_same<Stencil, ContinuumStencil>::value>(args, scale))
      return;
    cpu_detail::backward<T, Stencil>(args, shape, scale);
  }
};

}  // namespace continuum
