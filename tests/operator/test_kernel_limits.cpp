// Kernel-level robustness findings (fuzzing campaign), each a regression test
// that failed before its fix:
//  * attention_backward with zero heads (Hq = Hk = 0): the tiled kernel divided
//    by the head count (SIGFPE). Validation may reject such calls elsewhere; the
//    kernels themselves must not divide by zero, so they are called directly
//    (before the fix this died of SIGFPE at -O0, e.g. the dev preset; at -O2
//    GCC moved the division past the early return for Hk = 0);
//  * double storage, values near DBL_MAX, equal scores: Σ α_j v_j overflowed to
//    inf although the output, the mean of the values, is 0.9·DBL_MAX.
#include <catch2/catch.hpp>

#include <cfloat>

#include "operator/harness.hpp"

using namespace harness;
using continuum::index_t;

TEMPLATE_TEST_CASE("kernels: zero heads divide by nothing", "[operator][limits]", float, double) {
  using T = TestType;
  const bool fa = GENERATE(true, false);
  Case<T> c;
  c.Hq = c.Hk = 0;
  c.Lq = c.Lk = 4;
  c.alloc();
  auto g = c.backward_args();
  g.compute = fa ? continuum::Compute::automatic : continuum::Compute::float64;
  const continuum::AttentionShape sh{c.B, 0, 0, c.Lq, c.Lk, c.D, c.D};
  continuum::attention_impl<continuum::cpu_t>::backward<T, continuum::ContinuumStencil>(g, sh, 0.5);
  CHECK(c.dtau[0] == T(0));
  auto f = c.forward_args();
  f.compute = fa ? continuum::Compute::automatic : continuum::Compute::float64;
  continuum::attention_impl<continuum::cpu_t>::forward<T, continuum::ContinuumStencil>(f, sh, 0.5);
  CHECK(c.dq.contiguous().empty());
}

TEST_CASE("kernels: values near DBL_MAX with equal scores do not overflow", "[operator][limits]") {
  const bool fa = GENERATE(true, false);
  const int kernel = GENERATE(0, 1);
  Case<double> c;
  c.Lq = 3;
  c.Lk = 6;
  c.D = 2;
  c.Dv = 2;
  c.vis.causal = GENERATE(false, true);
  c.kernel = kernel ? continuum::Kernel::softmax : continuum::Kernel::continuum;
  c.alloc();
  c.q.zero();  // equal scores: P_ij = 1 / (hi - lo), o_i = the mean of the visible values
  c.k.zero();
  c.v.for_each([](double& x) { x = 0.9 * DBL_MAX; });
  c.v.at(0, 0, 1, 1) = -0.9 * DBL_MAX;
  auto f = c.forward_args();
  f.compute = fa ? continuum::Compute::automatic : continuum::Compute::float64;
  continuum::attention_forward(continuum::cpu, f);
  for (index_t i = 0; i < c.Lq; ++i) {
    const auto rg = continuum::visible_range(c.visibility(), 0, i, c.Lq, c.Lk);
    double mean1 = 0;
    for (index_t j = rg.lo; j < rg.hi; ++j) mean1 += c.v.at(0, 0, j, 1) / double(rg.size());
    INFO("fa " << fa << " kernel " << kernel << " causal " << c.vis.causal << " row " << i);
    CHECK(c.o.at(0, 0, i, 0) == Approx(0.9 * DBL_MAX).epsilon(1e-14));
    CHECK(c.o.at(0, 0, i, 1) == Approx(mean1).epsilon(1e-14));
  }
}
