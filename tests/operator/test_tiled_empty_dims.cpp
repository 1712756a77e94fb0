// The CPU kernels (backends/cpu/tiled.hpp) with an empty head dimension: D = 0 (every score is 0, so o is a fixed average of
// the visible values) and Dv = 0 (no output columns, but lse, dQ, dK, dτ are
// still defined: dP = dO·V = 0, so dQ = dK = 0 and dτ = 0). Their workspace
// matrices then have no elements, and the kernels used to form pointers at
// non-zero offsets from the null data() of those matrices (UBSan, dev preset:
// "applying non-zero offset to null pointer"). Shapes cross the key tiles of
// the forward (512) and the backward (128) and the backward query tile (64);
// results must match the reference (in long double).
#include <catch2/catch.hpp>

#include <cmath>

#include "operator/harness.hpp"

using namespace harness;
using continuum::index_t;

TEMPLATE_TEST_CASE("tiled kernels: D = 0 and Dv = 0 give the reference's results", "[operator][tiled]", float,
                   double) {
  using T = TestType;
  const int dims = GENERATE(0, 1);  // 0: D = 0, Dv = 8; 1: D = 8, Dv = 0
  const int vis = GENERATE(0, 1, 3);
  const int kernel = GENERATE(0, 1);
  const index_t lq = GENERATE(70, 150);
  Case<T> c;
  c.B = 1;
  c.Hq = 2;
  c.Hk = 1;  // GQA: dK, dV summed over two query heads
  c.Lq = lq;
  c.Lk = continuum::cpu_detail::tiled::kBc + 12;
  c.D = dims == 0 ? 0 : 8;
  c.Dv = dims == 0 ? 8 : 0;
  c.scale = 0.5;  // the default 1/sqrt(D) needs D >= 1
  c.vis = visibility_code(vis);
  c.kernel = kernel ? continuum::Kernel::softmax : continuum::Kernel::continuum;
  c.tau = T(0.3);
  c.threads = 2;
  c.alloc();
  auto rng = rng_for(std::uint64_t(9100 + 100 * dims + 10 * vis + kernel) + std::uint64_t(lq));
  c.fill_uniform(rng);
  REQUIRE_NOTHROW(c.forward());
  REQUIRE_NOTHROW(c.backward());
  // Reference in long double (64-bit significand: far below both bounds, and
  // fast enough for the sanitizer build, unlike 256-bit MPFR).
  const auto p = c.template problem<long double>();
  const auto f = continuum::reference::forward(p);
  const auto g = continuum::reference::backward(p, c.template grad_out_ref<long double>());

  // Scores are O(1) here: the harness's fixed bounds (float 2e-6 forward,
  // 2e-5 backward; double 1e-13 / 1e-12, derived in harness.hpp).
  const double ft = forward_tolerance<T>(1.0, std::max<index_t>(c.D, 1));
  const double bt = backward_tolerance<T>(1.0, std::max<index_t>(c.D, 1));
  INFO("D " << c.D << " Dv " << c.Dv << " vis " << vis << " kernel " << kernel << " Lq " << lq);
  CHECK(all_finite(c.o.contiguous()));
  const Error eo = compare(c.o.contiguous(), f.out), el = compare(c.lse, f.lse);
  CHECK(eo.max_abs <= ft * std::max(eo.ref_scale, 1e-300));
  CHECK(el.max_abs <= ft * std::max(el.ref_scale, 1.0));
  for (const auto& [got, ref] : {std::make_pair(c.dq.contiguous(), g.grad_query),
                                 std::make_pair(c.dk.contiguous(), g.grad_key),
                                 std::make_pair(c.dv.contiguous(), g.grad_value)}) {
    const Error e = compare(got, ref);
    CHECK(e.max_abs <= bt * std::max(e.ref_scale, 1e-300));
  }
  CHECK(all_finite(c.dtau));
  if (dims == 0) {
    // Every score is 0: P depends only on the visible key range, and
    // s_ij = 0 makes dτ = -(1/τ) Σ dS_ij s_ij vanish.
    CHECK(c.dtau[0] == T(0));
  } else {
    // No value columns: dP = dO·V = 0, so dS = 0.
    c.dq.for_each([](T x) { CHECK(x == T(0)); });
    c.dk.for_each([](T x) { CHECK(x == T(0)); });
    CHECK(c.dtau[0] == T(0));
  }
  CHECK(c.o.padding_untouched());
}
