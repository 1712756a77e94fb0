// Operator forward (CPU) against the 256-bit reference fed the same rounded
// inputs (SPEC §3–§5): random and adversarial inputs, float and double.
// Tolerances: harness.hpp forward_tolerance (derivation there).
#include <catch2/catch.hpp>

#include "operator/harness.hpp"

using namespace harness;
using continuum::index_t;

TEMPLATE_TEST_CASE("forward matches the reference on random O(1) inputs", "[operator][forward]", float,
                   double) {
  use_mp_precision();
  const index_t D = GENERATE(1, 3, 17, 65);
  const auto shape = GENERATE(std::make_pair(1, 1), std::make_pair(1, 9), std::make_pair(7, 7),
                              std::make_pair(5, 9), std::make_pair(9, 5), std::make_pair(16, 16));
  const int vis = GENERATE(0, 1, 2, 3, 4, 5);
  Case<TestType> c;
  c.B = 2;
  c.Hq = 2;
  c.Hk = D == 3 ? 1 : 2;  // GQA for one head_dim
  c.Lq = shape.first;
  c.Lk = shape.second;
  c.D = D;
  c.Dv = D == 17 ? 5 : D;  // Dv ≠ D for one head_dim
  c.vis = visibility_code(vis);
  c.want_maps = true;
  c.alloc();
  auto rng = rng_for(static_cast<std::uint64_t>(D * 1000 + shape.first * 50 + shape.second * 3 + vis));
  c.fill_uniform(rng);
  check_forward<mp>(c, "random O(1)");
}

TEMPLATE_TEST_CASE("forward matches the reference at nearly equal adjacent scores", "[operator][forward]",
                   float, double) {
  use_mp_precision();
  // Scores s_j = q_0 · k_j0 with k_j0 = 0.25 + gap·pattern_j: adjacent gaps of
  // gap, 0 and 2·gap — the cancellation regime of every moment (a → 0).
  const double gap = GENERATE(1e-12, 1e-10, 1e-8, 1e-6, 1e-4, 1e-3);
  const int vis = GENERATE(0, 1, 3);
  Case<TestType> c;
  c.Lq = 6;
  c.Lk = 9;
  c.D = 3;
  c.Dv = 3;
  c.scale = 1.0;
  c.vis = visibility_code(vis);
  c.want_maps = true;
  c.alloc();
  auto rng = rng_for(17);
  c.fill_uniform(rng);
  const int pattern[9] = {0, 1, 1, 2, 3, 3, 1, 0, -1};
  for (index_t j = 0; j < c.Lk; ++j) {
    c.k.at(0, 0, j, 0) = static_cast<TestType>(0.25 + gap * pattern[j]);
    c.k.at(0, 0, j, 1) = TestType(0);
    c.k.at(0, 0, j, 2) = TestType(0);
  }
  for (index_t i = 0; i < c.Lq; ++i) c.q.at(0, 0, i, 0) = static_cast<TestType>(1 + 10 * i);
  check_forward<mp>(c, "near-equal scores");
}

TEMPLATE_TEST_CASE("forward matches the reference at large scores", "[operator][forward][conditioning]",
                   float, double) {
  use_mp_precision();
  // |s| up to 80 (float) and 700 (double): the tolerance grows as
  // ε(1 + max|s|)√D (harness.hpp).
  const bool is_float = sizeof(TestType) == sizeof(float);
  const double target = is_float ? GENERATE(10.0, 40.0, 80.0) : GENERATE(10.0, 80.0, 300.0, 700.0);
  const int vis = GENERATE(0, 1, 4);
  Case<TestType> c;
  c.B = 1;
  c.Hq = 2;
  c.Hk = 1;
  c.Lq = 9;
  c.Lk = 12;
  c.D = 17;
  c.vis = visibility_code(vis);
  c.want_maps = true;
  c.alloc();
  auto rng = rng_for(static_cast<std::uint64_t>(target * 10 + vis));
  c.fill_uniform(rng);
  // Rescale q so that the largest |s| is ≈ target.
  double smax = 0;
  const double scale = 1 / std::sqrt(17.0);
  for (index_t h = 0; h < 2; ++h)
    for (index_t i = 0; i < c.Lq; ++i)
      for (index_t j = 0; j < c.Lk; ++j) {
        double s = 0;
        for (index_t d = 0; d < c.D; ++d) s += double(c.q.at(0, h, i, d)) * double(c.k.at(0, 0, j, d));
        smax = std::max(smax, std::fabs(s * scale));
      }
  const double f = target / smax;
  c.q.for_each([&](TestType& x) { x = static_cast<TestType>(x * f); });
  check_forward<mp>(c, "large scores");
}

TEMPLATE_TEST_CASE("forward matches the reference at tau = 0.01", "[operator][forward][temperature]", float,
                   double) {
  use_mp_precision();
  const int vis = GENERATE(0, 1, 3);
  const auto shape = GENERATE(continuum::TemperatureShape::scalar, continuum::TemperatureShape::per_head,
                              continuum::TemperatureShape::per_query);
  Case<TestType> c;
  c.Hq = 2;
  c.Lq = 7;
  c.Lk = 8;
  c.D = 5;
  c.tau = static_cast<TestType>(0.01);
  c.tshape = shape;
  c.vis = visibility_code(vis);
  c.want_maps = true;
  c.alloc();
  auto rng = rng_for(99 + vis);
  c.fill_uniform(rng);
  if (shape == continuum::TemperatureShape::per_query)
    for (std::size_t t = 0; t < c.taus.size(); ++t) c.taus[t] = static_cast<TestType>(0.01 * (1 + t % 3));
  check_forward<mp>(c, "tau=0.01");
}

TEMPLATE_TEST_CASE("forward: empty rows, Lk = 1 and Lq != Lk both ways", "[operator][forward]", float,
                   double) {
  use_mp_precision();
  const auto shape = GENERATE(std::make_pair(3, 1), std::make_pair(1, 1), std::make_pair(2, 6),
                              std::make_pair(6, 2), std::make_pair(5, 5));
  const int vis = GENERATE(0, 1, 2, 4);
  const bool ranges = GENERATE(false, true);
  Case<TestType> c;
  c.B = 2;
  c.Lq = shape.first;
  c.Lk = shape.second;
  c.D = 3;
  c.Dv = 2;
  c.vis = visibility_code(vis);
  if (ranges) {
    // every other row empty; others see a random sub-range
    auto rng = rng_for(5);
    for (index_t b = 0; b < c.B; ++b)
      for (index_t i = 0; i < c.Lq; ++i) {
        const index_t lo = static_cast<index_t>(rng() % static_cast<unsigned>(c.Lk + 1));
        const index_t hi = (i + b) % 2 ? lo : lo + static_cast<index_t>(rng() % static_cast<unsigned>(c.Lk - lo + 1));
        c.range_lo.push_back(lo);
        c.range_hi.push_back(hi);
      }
  }
  c.want_maps = true;
  c.alloc();
  auto rng = rng_for(11);
  c.fill_uniform(rng);
  check_forward<mp>(c, "empty/Lk=1/Lq!=Lk");
  // empty rows: output exactly 0, lse = -inf (SPEC §3)
  const auto p = c.template problem<long double>();
  for (index_t b = 0; b < c.B; ++b)
    for (index_t i = 0; i < c.Lq; ++i) {
      const auto r = p.visible(b, i);
      if (r.first < r.second) continue;
      CHECK(c.lse[static_cast<std::size_t>(b * c.Lq + i)] == -std::numeric_limits<TestType>::infinity());
      for (index_t d = 0; d < c.dv_dim(); ++d) CHECK(c.o.at(b, 0, i, d) == TestType(0));
    }
}

TEMPLATE_TEST_CASE("forward softmax and focal kernels match the reference softmax", "[operator][forward]",
                   float, double) {
  use_mp_precision();
  const auto kernel = GENERATE(continuum::Kernel::softmax, continuum::Kernel::focal);
  const int vis = GENERATE(0, 1, 3);
  Case<TestType> c;
  c.Hq = 2;
  c.Lq = 6;
  c.Lk = 7;
  c.D = 8;
  c.kernel = kernel;
  c.tau = static_cast<TestType>(0.3);
  c.vis = visibility_code(vis);
  c.want_maps = true;
  c.alloc();
  auto rng = rng_for(3 + vis);
  c.fill_uniform(rng);
  check_forward<mp>(c, "softmax/focal");
}

TEMPLATE_TEST_CASE("forward through BSHD strided views with padded rows", "[operator][forward][layout]", float,
                   double) {
  use_mp_precision();
  const int vis = GENERATE(0, 1, 4);
  Case<TestType> c;
  c.B = 2;
  c.Hq = 4;
  c.Hk = 2;
  c.Lq = 5;
  c.Lk = 6;
  c.D = 7;
  c.Dv = 3;
  c.bshd = true;
  c.pad = 1;  // NaN in every padding element: must never be read
  c.vis = visibility_code(vis);
  c.alloc();
  auto rng = rng_for(21 + vis);
  c.fill_uniform(rng);
  check_forward<mp>(c, "bshd padded");
}
