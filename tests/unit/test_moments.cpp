// tests/unit/test_moments.cpp — accuracy of the exponential moments of MATH.md §5
// (μ0, μ1, μ2, ν, κ, ν2 in include/continuum/math/moments.hpp) against MPFR.
//
// For float and double, ≥ 10^5 arguments a ≤ 0 per function (log-spaced over the
// whole range, log-spaced densely over [1e-6, 1e4], random, fixed seed, and the
// special points: ±0, subnormals, -max, -∞, every threshold ±3 ulp). Each result
// is compared with the 400-bit MPFR value of the *same rounded input*; the max
// ulp error and the worst input are printed per function and type, and the test
// requires ≤ 2 ulp (the bound promised in moments.hpp).
#include <catch2/catch.hpp>

#include <continuum/math/moments.hpp>

#include "unit/mp_reference.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

using mpref::mpreal;
namespace cm = continuum;

namespace {

constexpr int kFuncs = 6;
const char* const kNames[kFuncs] = {"mu0", "mu1", "mu2", "nu", "kappa", "nu2"};

template <class T>
std::array<T, kFuncs> ours(T a) {
  return {cm::mu0(a), cm::mu1(a), cm::mu2(a), cm::nu(a), cm::kappa(a), cm::nu2(a)};
}
std::array<const mpreal*, kFuncs> refs(const mpref::Moments& m) {
  return {&m.mu0, &m.mu1, &m.mu2, &m.nu, &m.kappa, &m.nu2};
}

/// Points around which inputs are taken ±3 ulp: the thresholds of moments.hpp
/// and the magnitudes where a², a³ would overflow.
template <class T>
std::vector<T> interesting_points() {
  std::vector<T> p = {T(1), T(2), T(4), T(8), T(16), T(32), T(700), T(710), T(745), T(88), T(104)};
  // Taylor interval boundaries k + 1/2 and the switch to the closed forms.
  for (int k = 0; k < cm::detail::taylor_intervals; ++k) p.push_back(T(k + 0.5));
  if (std::is_same<T, double>::value) {
    for (double t : {1.3e154, 1.34078079299425956e154, 5.6e102, 5.64380309412236e102}) p.push_back(T(t));
  } else {
    for (double t : {1.8e19, 1.8446744e19, 7e12, 6.98492e12}) p.push_back(T(t));
  }
  return p;
}

/// The sweep's inputs, all ≤ 0 or -∞ (NaN is tested apart).
template <class T>
std::vector<T> sweep_inputs() {
  using L = std::numeric_limits<T>;
  std::vector<T> v = {T(0), -T(0), -L::denorm_min(), -2 * L::denorm_min(), -L::min(),
                      -L::max(), -L::infinity(), -L::epsilon(), T(-0.5)};
  for (T p : interesting_points<T>()) {
    T x = p;
    for (int k = 0; k < 3; ++k) x = std::nextafter(x, T(0));
    for (int k = 0; k < 7; ++k, x = std::nextafter(x, L::infinity())) v.push_back(-x);
  }
  // Log-spaced over the whole positive range, then densely over [1e-6, 1e4].
  const double lo = std::log(double(L::denorm_min())), hi = std::log(double(L::max()));
  const int n1 = 40000, n2 = 30000;
  for (int i = 0; i <= n1; ++i) v.push_back(-T(std::exp(lo + (hi - lo) * i / n1)));
  const double lo2 = std::log(1e-6), hi2 = std::log(1e4);
  for (int i = 0; i <= n2; ++i) v.push_back(-T(std::exp(lo2 + (hi2 - lo2) * i / n2)));
  // Random: uniform over [-64, 0] (where the evaluation switches), log-uniform over
  // [1e-30, 1e30]. Fixed seed.
  std::mt19937_64 gen(20261129);
  std::uniform_real_distribution<double> u64(0.0, 64.0), ulog(std::log(1e-30), std::log(1e30));
  for (int i = 0; i < 100000; ++i) v.push_back(-T(u64(gen)));
  for (int i = 0; i < 50000; ++i) v.push_back(-T(std::exp(ulog(gen))));
  return v;
}

template <class T>
struct Worst {
  double ulp = 0;
  T at = 0;
};

template <class T>
void check_sweep(const char* type) {
  const std::vector<T> in = sweep_inputs<T>();
  std::array<Worst<T>, kFuncs> worst{};
  for (T a : in) {
    const mpref::Moments m = mpref::mp_moments(mpreal(double(a), mpref::kPrec));
    const auto got = ours(a);
    const auto ref = refs(m);
    for (int f = 0; f < kFuncs; ++f) {
      const double e = mpref::ulp_error(got[f], *ref[f]);
      if (!(e <= worst[f].ulp)) worst[f] = {e, a};
      // MATH.md §5: every moment lies in [0, 1] for a ≤ 0.
      if (!(got[f] >= T(0) && got[f] <= T(1))) {
        FAIL_CHECK(kNames[f] << "(" << mpref::show(a) << ") = " << got[f] << " outside [0, 1]");
      }
    }
  }
  for (int f = 0; f < kFuncs; ++f) {
    std::cout << "[ulp] " << type << " " << kNames[f] << ": max " << worst[f].ulp
              << " ulp over " << in.size() << " args, worst at a = "
              << mpref::show(worst[f].at) << "\n";
  }
  for (int f = 0; f < kFuncs; ++f) {
    INFO(type << " " << kNames[f] << " worst at a = " << mpref::show(worst[f].at));
    CHECK(worst[f].ulp <= 2.0);
  }
}

}  // namespace

TEST_CASE("moments: max ulp error vs MPFR, double", "[moments][ulp]") {
  check_sweep<double>("double");
}
TEST_CASE("moments: max ulp error vs MPFR, float", "[moments][ulp]") {
  check_sweep<float>("float");
}

TEMPLATE_TEST_CASE("moments: exact limits at a = ±0 and a = -inf", "[moments][special]", float, double) {
  using T = TestType;
  const T inf = std::numeric_limits<T>::infinity();
  for (T z : {T(0), -T(0)}) {
    CHECK(cm::mu0(z) == T(1));
    CHECK(cm::mu1(z) == T(0.5));
    CHECK(cm::mu2(z) == T(1) / T(3));
    CHECK(cm::nu(z) == T(0.5));
    CHECK(cm::kappa(z) == T(1) / T(6));
    CHECK(cm::nu2(z) == T(1) / T(3));
  }
  for (T r : ours(-inf)) {
    CHECK(r == T(0));
    CHECK_FALSE(std::signbit(r));
  }
}

TEMPLATE_TEST_CASE("moments: NaN in gives NaN out", "[moments][special]", float, double) {
  using T = TestType;
  for (T r : ours(std::numeric_limits<T>::quiet_NaN())) CHECK(std::isnan(r));
  for (T r : ours(-std::numeric_limits<T>::quiet_NaN())) CHECK(std::isnan(r));
}

TEMPLATE_TEST_CASE("moments: asymptotes at -max (no overflow of a^2, a^3)", "[moments][special]",
                   float, double) {
  using T = TestType;
  using Catch::Matchers::WithinULP;
  using Catch::Matchers::WithinAbs;
  // a = -2^64 in float, -2^500 in double (a² overflows in float): μ0, ν, ν2 ~ 1/b,
  // μ1, κ ~ 1/b² (2^-128 is subnormal in float), μ2 ~ 2/b³ underflows to 0.
  const T b = std::ldexp(T(1), std::is_same<T, float>::value ? 64 : 500);
  const T a = -b;
  CHECK_THAT(cm::mu0(a), WithinULP(T(1) / b, 1));
  CHECK_THAT(cm::nu(a), WithinULP(T(1) / b, 1));
  CHECK_THAT(cm::nu2(a), WithinULP(T(1) / b, 1));
  CHECK_THAT(cm::mu1(a), WithinULP((T(1) / b) / b, 1));
  CHECK_THAT(cm::kappa(a), WithinULP((T(1) / b) / b, 1));
  CHECK_THAT(cm::mu2(a), WithinAbs(0, std::numeric_limits<T>::denorm_min()));
  const T m = -std::numeric_limits<T>::max();
  for (T r : ours(m)) CHECK(std::isfinite(r));
  CHECK(cm::mu0(m) > T(0));
  CHECK(cm::nu(m) > T(0));
}

TEMPLATE_TEST_CASE("moments: a > 0 just outside the domain stays finite", "[moments][special]", float,
                   double) {
  using T = TestType;
  for (T a : {T(1e-30), T(0.25), T(0.5)}) {
    for (T r : ours(a)) CHECK(std::isfinite(r));
  }
}

TEMPLATE_TEST_CASE("moments: mu0 for a > 0 is expm1(a)/a (MATH.md §7.7 uses e^x mu0(y - x))",
                   "[moments][ulp]", float, double) {
  using T = TestType;
  // Positive arguments up to where e^a/a overflows T; same 2 ulp bound as the sweep.
  const double top = std::is_same<T, float>::value ? 90.0 : 700.0;
  double worst = 0;
  T at = 0;
  for (int i = 0; i <= 20000; ++i) {
    const T a = T(std::exp(std::log(1e-30) + (std::log(top) - std::log(1e-30)) * i / 20000));
    const double e = mpref::ulp_error(cm::mu0(a), mpref::mp_moments(mpreal(double(a), mpref::kPrec)).mu0);
    if (e > worst) { worst = e; at = a; }
  }
  std::cout << "[ulp] " << (std::is_same<T, float>::value ? "float" : "double")
            << " mu0 (a > 0): max " << worst << " ulp, worst at a = " << mpref::show(at) << "\n";
  CHECK(worst <= 2.0);
}
