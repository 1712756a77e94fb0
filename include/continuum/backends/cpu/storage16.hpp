// backends/cpu/storage16.hpp — 16-bit storage on the CPU (docs/MATH.md §10,
// "Compute type"): two storage types, both Eigen's and both with the bits of
// PyTorch's types of the same name:
//   continuum::bfloat16  1 sign, 8 exponent, 7 stored mantissa bits
//                        (torch.bfloat16; unit roundoff 2^-8);
//   continuum::float16   IEEE binary16: 1 sign, 5 exponent, 10 stored mantissa
//                        bits, largest finite 65504 (torch.float16; unit
//                        roundoff 2^-11).
// Both round from float to nearest even. Like the CUDA backend's 16-bit types
// they are storage only and accumulate in float: lse, the temperature and dτ
// are float (accum_t, config.hpp), and a call computes in float.
#pragma once

#include <type_traits>

#include <Eigen/Core>

#include "../../config.hpp"

namespace continuum {

using bfloat16 = Eigen::bfloat16;
using float16 = Eigen::half;

template <>
struct accum<Eigen::bfloat16> {
  using type = float;
};
template <>
struct accum<Eigen::half> {
  using type = float;
};

/// Whether T is one of the 16-bit storage types (computed in float).
template <class T>
inline constexpr bool is_storage16_v = std::is_same<T, bfloat16>::value || std::is_same<T, float16>::value;

}  // namespace continuum
