// tests/unit/test_density.cpp — the three-point stencil of include/continuum/math/
// density.hpp (MATH.md §4, §5, §6): ContinuumStencil's weight α_j, ∂α_j/∂s_j, the
// coupling ∂α_j/∂s_{j±1} and the cell mass π_j against MPFR, finite differences,
// equal scores = softmax (MATH.md §7.2), Σπ = Σα = Z (MATH.md §4–§5), and the softmax
// policy.
#include <catch2/catch.hpp>

#include <continuum/math/density.hpp>

#include "unit/mp_reference.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

using mpref::mpreal;
namespace cm = continuum;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using Catch::Matchers::WithinULP;
using CS = cm::ContinuumStencil;
using SS = cm::SoftmaxStencil;

namespace {

mpreal mp(double v) { return mpreal(v, mpref::kPrec); }

/// The exact α, ∂α/∂s, π of MATH.md §4–§6 at exact scores; flat half-cells give e^s/2.
struct Stencil {
  mpreal weight, weight_ds, cell_mass;
};
Stencil mp_stencil(double left, double s, double right, bool hl, bool hr) {
  const mpreal half = mpfr::exp(mp(s)) / 2;
  Stencil r{mp(0), mp(0), mp(0)};
  for (int side = 0; side < 2; ++side) {
    const bool has = side == 0 ? hl : hr;
    if (!has) {
      r.weight += half;
      r.weight_ds += half;
      r.cell_mass += half;
      continue;
    }
    const mpref::Segment g = mpref::mp_segment(mp(s), mp(side == 0 ? left : right));
    r.weight += g.w;
    r.weight_ds += g.dx;
    r.cell_mass += g.half;
  }
  return r;
}

template <class T>
T stencil_fn(int f, T l, T s, T r, bool hl, bool hr) {
  switch (f) {
    case 0: return CS::weight(l, s, r, hl, hr);
    case 1: return CS::weight_ds(l, s, r, hl, hr);
    default: return CS::cell_mass(l, s, r, hl, hr);
  }
}
const char* const kNames[4] = {"weight", "weight_ds", "cell_mass", "coupling"};

/// Budgets (ulp, double): each side is a curve.hpp function (≤ 4.5, 5, 4 ulp by
/// test_curve's budget, or e^s/2 ≤ 1) and the sum of two positive terms adds one
/// rounding (≤ 1 ulp of the sum in the worst binade position). float: evaluated in
/// double and rounded once, 0.5 ulp + ~1e-7.
constexpr double kBudgetDouble[4] = {4.5 + 1, 5 + 1, 4 + 1, 4.5};
constexpr double kBudgetFloat = 0.5 + 1e-7;

template <class T>
void check_sweep(const char* type, int n) {
  std::mt19937_64 gen(4242);
  std::uniform_real_distribution<double> us(-40.0, 0.0), ud(std::log(1e-10), std::log(1e3)),
      u01(0, 1);
  std::array<double, 4> worst{};
  std::array<std::array<T, 3>, 4> at{};
  for (int i = 0; i < n; ++i) {
    // A score and two neighbours at distances log-uniform in [1e-10, 1e3] (or 0), then
    // shifted so their maximum is 0 (as the operators do) or, half the time, in [-20, 0].
    const double s0 = us(gen);
    auto neighbour = [&]() {
      const double d = u01(gen) < 0.05 ? 0.0 : std::exp(ud(gen));
      return u01(gen) < 0.5 ? s0 - d : s0 + d;
    };
    const double l0 = neighbour(), r0 = neighbour();
    const double top = std::max(s0, std::max(l0, r0));
    const double mx = top + (u01(gen) < 0.5 ? 0.0 : 20 * u01(gen));
    const T l = T(l0 - mx), s = T(s0 - mx), r = T(r0 - mx);
    const bool hl = i % 4 != 1, hr = i % 4 != 2;
    const Stencil ref = mp_stencil(double(l), double(s), double(r), hl, hr);
    const std::array<const mpreal*, 3> refs = {&ref.weight, &ref.weight_ds, &ref.cell_mass};
    for (int f = 0; f < 4; ++f) {
      double e;
      if (f < 3) {
        e = mpref::ulp_error(stencil_fn(f, l, s, r, hl, hr), *refs[f]);
      } else {
        e = mpref::ulp_error(CS::coupling(s, r), mpref::mp_segment(mp(double(s)), mp(double(r))).dy);
      }
      if (!(e <= worst[f])) {
        worst[f] = e;
        at[f] = {l, s, r};
      }
    }
  }
  for (int f = 0; f < 4; ++f) {
    std::cout << "[ulp] " << type << " ContinuumStencil::" << kNames[f] << ": max " << worst[f]
              << " ulp over " << n << " triples, worst at (l, s, r) = (" << mpref::show(at[f][0])
              << ", " << mpref::show(at[f][1]) << ", " << mpref::show(at[f][2]) << ")\n";
    CHECK(worst[f] <= (std::is_same<T, float>::value ? kBudgetFloat : kBudgetDouble[f]));
  }
}

}  // namespace

TEST_CASE("density: ContinuumStencil max ulp error vs MPFR, double", "[density][ulp]") {
  check_sweep<double>("double", 40000);
}
TEST_CASE("density: ContinuumStencil max ulp error vs MPFR, float", "[density][ulp]") {
  check_sweep<float>("float", 40000);
}

TEMPLATE_TEST_CASE("density: equal scores give alpha = e^s, as softmax (MATH.md §7.2)", "[density]", float,
                   double) {
  using T = TestType;
  for (double sd : {0.0, -0.3, -5.0, -80.0}) {
    const T s = T(sd);
    // e^s correctly rounded from the double evaluation; softmax's exp(T) is within 1 ulp.
    const T e = T(std::exp(double(s)));
    for (int flags = 0; flags < 4; ++flags) {
      const bool hl = flags & 1, hr = flags & 2;
      CHECK_THAT(CS::weight(s, s, s, hl, hr), WithinULP(e, 0));
      CHECK_THAT(CS::cell_mass(s, s, s, hl, hr), WithinULP(e, 0));
      CHECK_THAT(CS::weight(s, s, s, hl, hr), WithinULP(SS::weight(s, s, s, hl, hr), 1));
    }
    // ∂α/∂s = e^s/3 per segment side, e^s/2 per flat half-cell; coupling e^s/6.
    CHECK_THAT(CS::weight_ds(s, s, s, true, true), WithinULP(T(2 * std::exp(double(s)) / 3), 1));
    CHECK_THAT(CS::coupling(s, s), WithinULP(T(std::exp(double(s)) / 6), 1));
  }
  // A whole row of equal scores: every α is bitwise the same, so P = 1/n exactly as softmax.
  const T s = T(-1.7);
  const int n = 9;
  for (int j = 0; j < n; ++j) {
    const T a = CS::weight(s, s, s, j > 0, j + 1 < n);
    CHECK(a == CS::weight(s, s, s, true, true));
  }
}

TEMPLATE_TEST_CASE("density: one visible key gives e^s for weight, derivative and mass", "[density]",
                   float, double) {
  using T = TestType;
  const T s = T(-2.5), junk = std::numeric_limits<T>::quiet_NaN();  // neighbours not read
  const T e = T(std::exp(double(s)));
  CHECK_THAT(CS::weight(junk, s, junk, false, false), WithinULP(e, 0));
  CHECK_THAT(CS::weight_ds(junk, s, junk, false, false), WithinULP(e, 0));
  CHECK_THAT(CS::cell_mass(junk, s, junk, false, false), WithinULP(e, 0));
}

TEMPLATE_TEST_CASE("density: -inf scores and NaN", "[density][special]", float, double) {
  using T = TestType;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const T s = T(-1);
  // A visible neighbour at -∞ contributes nothing on its side; a -∞ token has α = π = 0.
  CHECK(CS::weight(-inf, s, -inf, true, true) == T(0));
  CHECK(CS::weight(-inf, -inf, s, true, true) == T(0));
  CHECK(CS::cell_mass(-inf, -inf, s, true, true) == T(0));
  CHECK(CS::coupling(-inf, s) == T(0));
  CHECK_THAT(CS::weight(-inf, s, -inf, true, false), WithinULP(T(std::exp(-1.0) / 2), 0));
  CHECK(std::isnan(CS::weight(nan, s, s, true, true)));
  CHECK(std::isnan(CS::weight_ds(s, s, nan, true, true)));
  CHECK(std::isnan(CS::cell_mass(nan, s, s, true, true)));
  CHECK(std::isnan(CS::coupling(s, nan)));
}

TEST_CASE("density: weight_ds and coupling match central finite differences in double",
          "[density][gradient]") {
  // Same step and bound as test_curve (δ ≤ 100): relative 1e-7.
  std::mt19937_64 gen(77);
  std::uniform_real_distribution<double> us(-20.0, 0.0), ud(-4.6, 4.6), u01(0, 1);
  const double h = 1e-5;
  for (int i = 0; i < 3000; ++i) {
    const double s = us(gen);
    auto nb = [&]() {
      const double d = i % 25 == 0 ? 0.0 : std::exp(ud(gen));
      return u01(gen) < 0.5 ? s - d : s + d;
    };
    const double l = nb(), r = nb(), rr = nb();
    const bool hl = i % 3 != 1, hr = i % 3 != 2;
    INFO("l = " << l << ", s = " << s << ", r = " << r << ", hl = " << hl << ", hr = " << hr);
    // The FD of α rounds at ~ε|α|/h and truncates at ~h²|∂³α|; α can be far larger than
    // the derivative asked for (a neighbour 100 above s), so the bound is relative to the
    // derivative or absolute relative to the α differenced: 1e-7 and 1e-8·|α|.
    const auto near = [](double got, double fd, double alpha) {
      return std::fabs(got - fd) <= std::max(1e-7 * std::fabs(fd), 1e-8 * std::fabs(alpha));
    };
    const double a_j = CS::weight(l, s, r, hl, hr), a_jr = CS::weight(l, s, r, hl, true);
    const double a_n = CS::weight(s, r, rr, true, hr);
    const double fd_s = (CS::weight(l, s + h, r, hl, hr) - CS::weight(l, s - h, r, hl, hr)) / (2 * h);
    CHECK(near(CS::weight_ds(l, s, r, hl, hr), fd_s, a_j));
    // ∂α_j/∂s_{j+1} and ∂α_{j+1}/∂s_j (α_{j+1} has left neighbour s, right rr) both equal coupling.
    const double fd_r = (CS::weight(l, s, r + h, hl, true) - CS::weight(l, s, r - h, hl, true)) / (2 * h);
    const double fd_n = (CS::weight(s + h, r, rr, true, hr) - CS::weight(s - h, r, rr, true, hr)) / (2 * h);
    CHECK(near(CS::coupling(s, r), fd_r, a_jr));
    CHECK(near(CS::coupling(s, r), fd_n, a_n));
    // and relative 1e-7 when every segment involved is short (α of the same size as α').
    if (std::fabs(r - s) < 5 && std::fabs(rr - r) < 5 && std::fabs(l - s) < 5) {
      CHECK_THAT(CS::coupling(s, r), WithinRel(fd_n, 1e-7));
      CHECK_THAT(CS::weight_ds(l, s, r, hl, hr), WithinRel(fd_s, 1e-7));
    }
    CHECK(CS::coupling(s, r) == CS::coupling(r, s));
  }
}

TEMPLATE_TEST_CASE("density: cell masses and weights of a row both sum to Z (MATH.md §4-5)", "[density]",
                   float, double) {
  // Σ_j π_j = Σ_j α_j = Z = ∫ e^{s(t)} dt over [lo - 1/2, hi - 1/2]: both integrate the same
  // density. Reference Z at 400 bits: Σ segments e^{max} μ0(-δ) + the two flat half-cells.
  // Tolerance: each term is within its budget (≤ 6 ulp double, ≤ 0.5 float, see above), the
  // sums are accumulated in double (n·2^-53): double (12 + n)·ε, float 2·ε_float.
  using T = TestType;
  const double eps = std::numeric_limits<T>::epsilon();
  std::mt19937_64 gen(31337);
  std::normal_distribution<double> nd;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + trial % 64;
    const double scale = std::pow(10.0, double(trial % 4) - 1.0);  // 0.1 … 100
    std::vector<T> s(n);
    double mx = -HUGE_VAL;
    for (auto& v : s) {
      v = T(scale * nd(gen));
      mx = std::max(mx, double(v));
    }
    for (auto& v : s) v = T(double(v) - mx);  // shifted by the row maximum, as the operators do
    if (trial % 7 == 3 && n > 2) s[n / 2] = -std::numeric_limits<T>::infinity();
    double sum_a = 0, sum_p = 0;
    mpreal z = mpfr::exp(mp(double(s[0]))) / 2 + mpfr::exp(mp(double(s[n - 1]))) / 2;
    for (int j = 0; j < n; ++j) {
      const bool hl = j > 0, hr = j + 1 < n;
      const T l = hl ? s[j - 1] : T(0), r = hr ? s[j + 1] : T(0);
      sum_a += double(CS::weight(l, s[j], r, hl, hr));
      sum_p += double(CS::cell_mass(l, s[j], r, hl, hr));
      if (hr && !(std::isinf(s[j]) || std::isinf(s[j + 1]))) {
        const mpreal x = mp(double(s[j])), y = mp(double(s[j + 1]));
        const mpreal m = x > y ? x : y;
        z += mpfr::exp(m) * mpref::mp_moments(-mpfr::abs(x - y)).mu0;
      }
    }
    const double tol = std::is_same<T, float>::value ? 2 * eps : (12 + n) * eps;
    INFO("trial " << trial << ", n = " << n << ", scale = " << scale);
    // Results in T's subnormal range round absolutely: ≤ ½ denorm_min per term.
    const double atol = n * double(std::numeric_limits<T>::denorm_min());
    CHECK_THAT(sum_p, WithinRel(sum_a, tol) || WithinAbs(sum_a, atol));
    CHECK_THAT(sum_a, WithinRel(z.toDouble(), tol) || WithinAbs(z.toDouble(), atol));
  }
}

TEMPLATE_TEST_CASE("density: SoftmaxStencil is plain exp", "[density]", float, double) {
  using T = TestType;
  STATIC_REQUIRE(CS::has_halo);
  STATIC_REQUIRE_FALSE(SS::has_halo);
  for (double sd : {0.0, -1.0, -30.0}) {
    const T s = T(sd);
    CHECK(SS::weight(T(5), s, T(7), true, true) == std::exp(s));
    CHECK(SS::weight_ds(T(5), s, T(7), true, true) == std::exp(s));
    CHECK(SS::cell_mass(T(5), s, T(7), true, true) == std::exp(s));
    CHECK(SS::coupling(s, T(3)) == T(0));
  }
  CHECK(std::strcmp(cm::kernel_name(cm::Kernel::continuum), "continuum") == 0);
  CHECK(std::strcmp(cm::kernel_name(cm::Kernel::softmax), "softmax") == 0);
  CHECK(std::strcmp(cm::kernel_name(cm::Kernel::focal), "focal") == 0);
}
