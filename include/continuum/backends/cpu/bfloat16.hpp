// backends/cpu/bfloat16.hpp — bfloat16 storage on the CPU (docs/MATH.md §10,
// "Compute type"): continuum::bfloat16 is Eigen's bfloat16 (1 sign, 8 exponent
// and 7 stored mantissa bits; from float by round-to-nearest-even), the same
// bits as PyTorch's torch.bfloat16. Like the CUDA backend's 16-bit types it
// accumulates in float: lse, the temperature and dτ are float
// (accum_t<bfloat16>, config.hpp).
#pragma once

#include <Eigen/Core>

#include "../../config.hpp"

namespace continuum {

using bfloat16 = Eigen::bfloat16;

template <>
struct accum<Eigen::bfloat16> {
  using type = float;
};

}  // namespace continuum
