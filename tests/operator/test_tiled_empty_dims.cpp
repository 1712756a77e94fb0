// The tiled CPU kernels (backends/cpu/tiled.hpp, float_arithmetic = true) with
// an empty head dimension: D = 0 (every score is 0, so o is a fixed average of
// the visible values) and Dv = 0 (no output columns, but lse, dQ, dK, dτ are
// still defined: dP = dO·V = 0, so dQ = dK = 0 and dτ = 0). Their workspace
// matrices then have no elements, and the kernels used to form pointers at
// non-zero offsets from the null data() of those matrices (UBSan, dev preset:
// "applying non-zero offset to null pointer"). Shapes cross the key tile (128)
// and the backward query tile (64); results must match the exact kernels.
#include <catch2/catch.hpp>

#include <cmath>

#include "operator/harness.hpp"

using namespace harness;
using continuum::index_t;

namespace {

template <class T>
double max_diff(const std::vector<T>& a, const std::vector<T>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(double(a[i])) || std::isnan(double(b[i]))) return INFINITY;
    if (a[i] == b[i]) continue;  // also equal infinities (lse of an empty row)
    m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  }
  return m;
}

}  // namespace

TEMPLATE_TEST_CASE("tiled kernels: D = 0 and Dv = 0 give the exact kernels' results", "[operator][tiled]", float,
                   double) {
  using T = TestType;
  const int dims = GENERATE(0, 1);  // 0: D = 0, Dv = 8; 1: D = 8, Dv = 0
  const int vis = GENERATE(0, 1, 3);
  const int kernel = GENERATE(0, 1);
  const index_t lq = GENERATE(70, 150);
  Case<T> exact;
  exact.B = 1;
  exact.Hq = 2;
  exact.Hk = 1;  // GQA: dK, dV summed over two query heads
  exact.Lq = lq;
  exact.Lk = 140;
  exact.D = dims == 0 ? 0 : 8;
  exact.Dv = dims == 0 ? 8 : 0;
  exact.scale = 0.5;  // the default 1/sqrt(D) needs D >= 1
  exact.vis = visibility_code(vis);
  exact.kernel = kernel ? continuum::Kernel::softmax : continuum::Kernel::continuum;
  exact.tau = T(0.3);
  exact.threads = 2;
  exact.alloc();
  auto rng = rng_for(std::uint64_t(9100 + 100 * dims + 10 * vis + kernel) + std::uint64_t(lq));
  exact.fill_uniform(rng);
  Case<T> tiled = exact;

  exact.forward();
  exact.backward();
  {
    auto f = tiled.forward_args();
    f.compute = continuum::Compute::automatic;
    REQUIRE_NOTHROW(continuum::attention_forward(continuum::cpu, f));
    auto b = tiled.backward_args();
    b.compute = continuum::Compute::automatic;
    REQUIRE_NOTHROW(continuum::attention_backward(continuum::cpu, b));
  }

  // float: the tiled kernels compute in float (errors ~1e-6 of the scale,
  // params.hpp); double: in double.
  const double tol = std::is_same<T, float>::value ? 1e-5 : 1e-12;
  INFO("D " << exact.D << " Dv " << exact.Dv << " vis " << vis << " kernel " << kernel << " Lq " << lq);
  CHECK(all_finite(tiled.o.contiguous()));
  CHECK(max_diff(tiled.o.contiguous(), exact.o.contiguous()) <= tol);
  CHECK(max_diff(tiled.lse, exact.lse) <= tol * 10);
  CHECK(max_diff(tiled.dq.contiguous(), exact.dq.contiguous()) <= tol);
  CHECK(max_diff(tiled.dk.contiguous(), exact.dk.contiguous()) <= tol);
  CHECK(max_diff(tiled.dv.contiguous(), exact.dv.contiguous()) <= tol);
  CHECK(all_finite(tiled.dtau));
  CHECK(std::abs(double(tiled.dtau[0]) - double(exact.dtau[0])) <= tol * 100);
  if (dims == 0) {
    // Every score is 0: P depends only on the visible key range, and
    // s_ij = 0 makes dτ = -(1/τ) Σ dS_ij s_ij vanish.
    CHECK(tiled.dtau[0] == T(0));
  } else {
    // No value columns: dP = dO·V = 0, so dS = 0.
    tiled.dq.for_each([](T x) { CHECK(x == T(0)); });
    tiled.dk.for_each([](T x) { CHECK(x == T(0)); });
    CHECK(tiled.dtau[0] == T(0));
  }
  CHECK(tiled.o.padding_untouched());
}
