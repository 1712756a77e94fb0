// Operator backward (CPU, MATH.md §6) against the 256-bit reference and against
// central finite differences of the operator's own forward, for the loss
// L = Σ dO∘O with a random dO. Temperature scalar / per head / per query, GQA,
// BSHD strided views, Dv ≠ D.
#include <catch2/catch.hpp>

#include "operator/harness.hpp"

using namespace harness;
using continuum::index_t;
using continuum::TemperatureShape;

TEMPLATE_TEST_CASE("backward matches the reference on random O(1) inputs", "[operator][backward]", float,
                   double) {
  use_mp_precision();
  const index_t D = GENERATE(1, 3, 17);
  const auto shape = GENERATE(std::make_pair(1, 1), std::make_pair(1, 6), std::make_pair(7, 7),
                              std::make_pair(4, 9), std::make_pair(9, 4));
  const int vis = GENERATE(0, 1, 2, 4, 5, 6);
  const auto tshape = GENERATE(TemperatureShape::scalar, TemperatureShape::per_head, TemperatureShape::per_query);
  Case<TestType> c;
  c.B = 2;
  c.Hq = 2;
  c.Hk = D == 3 ? 1 : 2;  // GQA
  c.Lq = shape.first;
  c.Lk = shape.second;
  c.D = D;
  c.Dv = D == 17 ? 4 : D == 1 ? 2 : D;  // Dv ≠ D
  c.vis = visibility_code(vis);
  c.tshape = tshape;
  c.alloc();
  auto rng = rng_for(static_cast<std::uint64_t>(D * 7919 + shape.first * 97 + shape.second * 13 + vis * 5 +
                                                static_cast<int>(tshape)));
  c.fill_uniform(rng);
  random_temperatures(c, rng);
  check_backward<mp>(c, "random O(1)");
}

TEMPLATE_TEST_CASE("backward matches the reference through BSHD padded views", "[operator][backward][layout]",
                   float, double) {
  use_mp_precision();
  const int vis = GENERATE(0, 1, 4);
  Case<TestType> c;
  c.B = 2;
  c.Hq = 4;
  c.Hk = 2;
  c.Lq = 6;
  c.Lk = 5;
  c.D = 7;
  c.Dv = 3;
  c.bshd = true;
  c.pad = 2;
  c.vis = visibility_code(vis);
  c.tshape = TemperatureShape::per_head;
  c.alloc();
  auto rng = rng_for(300 + vis);
  c.fill_uniform(rng);
  random_temperatures(c, rng);
  check_backward<mp>(c, "bshd padded");
}

TEMPLATE_TEST_CASE("backward matches the reference at nearly equal scores and tau = 0.01",
                   "[operator][backward]", float, double) {
  use_mp_precision();
  const double gap = GENERATE(0.0, 1e-12, 1e-8, 1e-4);
  const double tau = GENERATE(1.0, 0.01);
  Case<TestType> c;
  c.Lq = 4;
  c.Lk = 7;
  c.D = 2;
  c.Dv = 2;
  c.scale = 1.0;
  c.tau = static_cast<TestType>(tau);
  c.alloc();
  auto rng = rng_for(55);
  c.fill_uniform(rng);
  const int pattern[7] = {0, 1, 1, 2, 0, -1, 3};
  for (index_t j = 0; j < c.Lk; ++j) {
    c.k.at(0, 0, j, 0) = static_cast<TestType>(0.5 + gap * pattern[j]);
    c.k.at(0, 0, j, 1) = TestType(0);
  }
  for (index_t i = 0; i < c.Lq; ++i) {
    c.q.at(0, 0, i, 0) = static_cast<TestType>(0.01 * (1 + i));  // |s| ≤ 0.02 / tau
    c.q.at(0, 0, i, 1) = TestType(0);
  }
  check_backward<mp>(c, "near-equal / tau=0.01");
}

TEMPLATE_TEST_CASE("backward softmax kernel matches the reference softmax", "[operator][backward]", float,
                   double) {
  use_mp_precision();
  const int vis = GENERATE(0, 1, 3);
  Case<TestType> c;
  c.Hq = 2;
  c.Lq = 5;
  c.Lk = 6;
  c.D = 4;
  c.kernel = continuum::Kernel::softmax;
  c.tshape = TemperatureShape::per_query;
  c.vis = visibility_code(vis);
  c.alloc();
  auto rng = rng_for(404 + vis);
  c.fill_uniform(rng);
  random_temperatures(c, rng);
  check_backward<mp>(c, "softmax");
}

// ---------------------------------------------------------------------------
// Central finite differences of the operator's own forward (double).
//
// Step h = 1e-5 on O(1) inputs. Truncation: h²/6 · |L'''| ≲ 1e-10 · O(10).
// Rounding: the forward is accurate to 1e-13 relative (forward tolerance), so
// the difference quotient carries ≤ 2 · 1e-13 · |L| / (2h) = 1e-8 · |L|, with
// |L| = |Σ dO∘O| ≤ Lq · Dv. Tolerance 1e-6 relative to max|grad| (≥ 10× both).

namespace {

/// Max relative error of the analytic gradient against central differences,
/// over the elements listed (all if `sample` is empty).
double fd_error(Case<double>& c, Tensor<double>& x, const Tensor<double>& grad, double h) {
  double worst = 0, scale = 0;
  for (const double g : grad.contiguous()) scale = std::max(scale, std::fabs(g));
  for (index_t b = 0; b < x.view.batch; ++b)
    for (index_t hh = 0; hh < x.view.heads; ++hh)
      for (index_t s = 0; s < x.view.seq; ++s)
        for (index_t d = 0; d < x.view.dim; ++d) {
          const double fd = central_difference(c, x.at(b, hh, s, d), h);
          worst = std::max(worst, std::fabs(fd - grad.at(b, hh, s, d)) / std::max(scale, 1e-300));
        }
  return worst;
}

double fd_error_tau(Case<double>& c, const std::vector<double>& grad, double h) {
  double worst = 0, scale = 0;
  for (double g : grad) scale = std::max(scale, std::fabs(g));
  for (std::size_t t = 0; t < grad.size(); ++t) {
    double& e = c.tshape == TemperatureShape::scalar ? c.tau : c.taus[t];
    worst = std::max(worst, std::fabs(central_difference(c, e, h) - grad[t]) / std::max(scale, 1e-300));
  }
  return worst;
}

}  // namespace

TEST_CASE("backward equals central finite differences of the forward (double)", "[operator][backward][fd]") {
  const auto tshape = GENERATE(TemperatureShape::scalar, TemperatureShape::per_head, TemperatureShape::per_query);
  const int vis = GENERATE(0, 1, 3, 5);
  const bool bshd = GENERATE(false, true);
  Case<double> c;
  c.B = 2;
  c.Hq = 4;
  c.Hk = 2;  // GQA
  c.Lq = 4;
  c.Lk = 5;
  c.D = 3;
  c.Dv = 2;
  c.bshd = bshd;
  c.pad = bshd ? 1 : 0;
  c.tshape = tshape;
  c.vis = visibility_code(vis);
  c.alloc();
  auto rng = rng_for(600 + vis * 3 + static_cast<int>(tshape) + 17 * bshd);
  c.fill_uniform(rng);
  random_temperatures(c, rng, 0.5, 1.5);
  c.forward();
  c.backward();
  const Tensor<double> dq = c.dq, dk = c.dk, dv = c.dv;
  const std::vector<double> dtau = c.dtau;
  const double h = 1e-5;
  const double eq = fd_error(c, c.q, dq, h), ek = fd_error(c, c.k, dk, h), ev = fd_error(c, c.v, dv, h);
  const double et = fd_error_tau(c, dtau, h);
  INFO("tshape=" << static_cast<int>(tshape) << " vis=" << vis << " bshd=" << bshd << " dQ " << eq << " dK " << ek
                 << " dV " << ev << " dtau " << et);
  record("backward vs FD dQ double", eq);
  record("backward vs FD dK double", ek);
  record("backward vs FD dV double", ev);
  record("backward vs FD dtau double", et);
  CHECK(eq < 1e-6);
  CHECK(ek < 1e-6);
  CHECK(ev < 1e-6);
  CHECK(et < 1e-6);
}

TEMPLATE_TEST_CASE("backward across key and query tiles with explicit ranges", "[operator][backward][tiles]",
                   float, double) {
  // As the forward tiles test: ranges on both sides of the backward's key
  // tiles (126 keys for continuum, 128 for softmax) and query tiles (64
  // rows), GQA, per-query τ; long double reference.
  const auto shape = GENERATE(std::make_pair(33, 130), std::make_pair(17, 200), std::make_pair(70, 65));
  const int mode = GENERATE(0, 1, 2);
  Case<TestType> c;
  c.B = 2;
  c.Hq = 4;
  c.Hk = 2;
  c.Lq = shape.first;
  c.Lk = shape.second;
  c.D = 9;
  c.Dv = 4;
  c.tshape = TemperatureShape::per_query;
  auto rng = rng_for(static_cast<std::uint64_t>(shape.first * 1000 + shape.second * 7 + mode + 50));
  if (mode != 1) random_ranges(c, rng);
  if (mode >= 1) {
    c.vis.causal = true;
    c.vis.window_left = mode == 1 ? 69 : -1;  // 70 keys
  }
  c.alloc();
  c.fill_uniform(rng, -1.5, 1.5);
  random_temperatures(c, rng);
  check_backward<long double>(c, "tiles");
}
