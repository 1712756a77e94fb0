// detail/dispatch.hpp — the public entry points' dispatch on the kernel
// (MATH.md §4, §8): continuum → ContinuumStencil; softmax and focal →
// SoftmaxStencil (focal is softmax with the temperature given).
#pragma once

#include "../math/density.hpp"

namespace continuum {
namespace detail {

/// Calls f(Stencil{}) with the stencil policy of `kernel`: f is a generic
/// lambda that uses only the argument's type, e.g.
///   with_stencil(args.kernel, [&](auto s) { run<decltype(s)>(...); });
template <class F>
void with_stencil(Kernel kernel, F&& f) {
  if (kernel == Kernel::continuum) f(ContinuumStencil{});
  else f(SoftmaxStencil{});
}

}  // namespace detail
}  // namespace continuum
