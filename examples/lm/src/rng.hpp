// rng.hpp — a small, portable, seeded random source (SplitMix64 + Box–Muller),
// the same on every standard library: generate's sampling, the tests' weights.
#pragma once

#include <cmath>
#include <cstdint>

namespace lm {

class Rng {
 public:
  explicit Rng(std::uint64_t seed, std::uint64_t stream = 0)
      : state_(seed * 0x9E3779B97F4A7C15ull + stream * 0xD1B54A32D192ED03ull + 1) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n), unbiased (rejection), n ≥ 1.
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t limit = ~std::uint64_t(0) - (~std::uint64_t(0) % n);
    std::uint64_t x;
    do { x = next(); } while (x >= limit);
    return x % n;
  }
  /// Standard normal (Box–Muller, one value per call).
  double normal() {
    double u1 = uniform();
    while (u1 <= 0) u1 = uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t state_;
};

}  // namespace lm
