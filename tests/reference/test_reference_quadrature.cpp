// The multiprecision reference (attention/reference.hpp) checked against
// things that share none of its formulas: direct quadrature of the curve
// (MATH.md §7.8), finite differences of itself (MATH.md §6), the visibility rules
// written out by hand (MATH.md §3), and its own long double instantiation.
#include <catch2/catch.hpp>
#include <mpreal.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include <continuum/attention/reference.hpp>
#include <continuum/attention/visibility.hpp>

#include "reference/quadrature.hpp"

using continuum::index_t;
using mp = mpfr::mpreal;
namespace ref = continuum::reference;
namespace quad = continuum::quadrature;

namespace {

void precision() { mp::set_default_prec(256); }

/// A random problem in R: B=1, heads as given, entries uniform in [-amp, amp]
/// (exact doubles), scale 1/sqrt(D) in R.
template <class R>
ref::Problem<R> random_problem(std::mt19937_64& rng, index_t Lq, index_t Lk, index_t D,
                               double amp, index_t Hq = 1, index_t Hk = 1, index_t Dv = 2) {
  std::uniform_real_distribution<double> u(-amp, amp);
  ref::Problem<R> p;
  p.heads_q = Hq;
  p.heads_kv = Hk;
  p.len_q = Lq;
  p.len_k = Lk;
  p.dim = D;
  p.dim_v = Dv;
  for (index_t t = 0; t < Hq * Lq * D; ++t) p.query.push_back(R(u(rng)));
  for (index_t t = 0; t < Hk * Lk * D; ++t) p.key.push_back(R(u(rng)));
  std::uniform_real_distribution<double> uv(-1, 1);
  for (index_t t = 0; t < Hk * Lk * Dv; ++t) p.value.push_back(R(uv(rng)));
  using std::sqrt;
  p.scale = R(1) / sqrt(R(D));
  return p;
}

double rel_diff(const mp& a, const mp& b, const mp& scale) {
  return static_cast<double>(abs(a - b) / (scale > 0 ? scale : mp(1)));
}

/// Compares every row of p with quadrature: o, lse, P, π. Returns the max
/// error (relative to max|o| for o, absolute for lse / P / π).
double max_error_vs_quadrature(const ref::Problem<mp>& p) {
  const quad::GaussLegendre<mp> rule(24);
  double worst = 0;
  for (index_t b = 0; b < p.batch; ++b)
    for (index_t h = 0; h < p.heads_q; ++h)
      for (index_t i = 0; i < p.len_q; ++i) {
        const auto r = ref::forward_row(p, b, h, i);
        const auto q = quad::integrate_row(p, b, h, i, rule, 4);
        REQUIRE(r.lo == q.lo);
        REQUIRE(r.hi == q.hi);
        if (r.hi == r.lo) {
          REQUIRE(isinf(r.lse));
          continue;
        }
        mp scale = 0;
        for (const auto& x : r.out) scale = std::max(scale, mp(abs(x)));
        for (std::size_t d = 0; d < r.out.size(); ++d)
          worst = std::max(worst, rel_diff(r.out[d], q.out[d], scale));
        worst = std::max(worst, rel_diff(r.lse, q.lse, mp(1)));
        for (std::size_t j = 0; j < r.prob.size(); ++j) {
          worst = std::max(worst, rel_diff(r.prob[j], q.prob[j], mp(1)));
          worst = std::max(worst, rel_diff(r.cell[j], q.cell[j], mp(1)));
        }
      }
  return worst;
}

}  // namespace

TEST_CASE("reference forward equals quadrature of the curve (MATH.md §7.8)", "[reference][quadrature]") {
  precision();
  // Quadrature error (MATH.md §7.8 comment in quadrature.hpp) < 1e-40 for
  // |Δs| ≤ 40; 256-bit rounding ~1e-75. Tolerance 1e-35 leaves room for both.
  const index_t Lk = GENERATE(1, 2, 3, 7);
  const double amp = GENERATE(0.5, 2.0, 4.0);  // |s| up to ≈ amp²·√D ≈ 28
  const bool causal = GENERATE(false, true);
  // Windows (left, right) around the diagonal key (MATH.md §3); -1 = unlimited.
  const auto window = GENERATE(std::pair<index_t, index_t>{-1, -1}, std::pair<index_t, index_t>{0, 0},
                               std::pair<index_t, index_t>{1, 0}, std::pair<index_t, index_t>{4, 0},
                               std::pair<index_t, index_t>{1, 1}, std::pair<index_t, index_t>{0, 2});
  auto rng = std::mt19937_64(1000 + Lk * 31 + static_cast<int>(amp * 7) + causal * 3 +
                             static_cast<int>(window.first * 5 + window.second));
  auto p = random_problem<mp>(rng, 5, Lk, 3, amp);
  p.causal = causal;
  p.window_left = window.first;
  p.window_right = window.second;
  const double err = max_error_vs_quadrature(p);
  INFO("Lk=" << Lk << " amp=" << amp << " causal=" << causal << " window=(" << window.first << ","
             << window.second << ")");
  CHECK(err < 1e-35);
}

TEST_CASE("reference equals quadrature at nearly equal adjacent scores", "[reference][quadrature]") {
  precision();
  // The cancellation regime of the closed forms: adjacent gaps 0, 1e-12 … 1e-3.
  const double gap = GENERATE(0.0, 1e-12, 1e-9, 1e-6, 1e-3, 0.7);
  ref::Problem<mp> p;
  p.len_q = 1;
  p.len_k = 6;
  p.dim = 1;
  p.dim_v = 1;
  p.query = {mp(1)};
  const double ks[6] = {0.3, 0.3 + gap, 0.3 + 2 * gap, 0.3 + gap, -0.2, -0.2 - gap};
  for (double k : ks) p.key.push_back(mp(k));
  p.value = {mp(1), mp(-2), mp(3), mp(0.5), mp(-1), mp(2)};
  p.scale = 1;
  const double err = max_error_vs_quadrature(p);
  INFO("gap=" << gap);
  CHECK(err < 1e-35);
}

TEST_CASE("reference backward equals central differences of the reference", "[reference][gradient]") {
  precision();
  // Central differences in 256-bit arithmetic: truncation h²·f''' ~ 1e-50 at
  // h = 1e-25, rounding 1e-77/h ~ 1e-52. Tolerance 1e-40 relative.
  const auto shape = GENERATE(continuum::TemperatureShape::scalar,
                              continuum::TemperatureShape::per_head,
                              continuum::TemperatureShape::per_query);
  const bool causal = GENERATE(false, true);
  auto rng = std::mt19937_64(77 + static_cast<int>(shape) * 2 + causal);
  auto p = random_problem<mp>(rng, 4, 5, 3, 1.5, /*Hq=*/2, /*Hk=*/1, /*Dv=*/2);
  p.causal = causal;
  p.window_left = causal ? 2 : 1;  // causal: 3 keys; else (1, 1) around the diagonal
  p.window_right = causal ? -1 : 1;
  p.temperature_shape = shape;
  std::uniform_real_distribution<double> ut(0.3, 2.0);
  const std::size_t nt = shape == continuum::TemperatureShape::scalar ? 1
                         : shape == continuum::TemperatureShape::per_head ? 2 : 8;
  p.temperature.clear();
  for (std::size_t t = 0; t < nt; ++t) p.temperature.push_back(mp(ut(rng)));
  std::vector<mp> dout;
  std::uniform_real_distribution<double> ud(-1, 1);
  for (int t = 0; t < 2 * 4 * 2; ++t) dout.push_back(mp(ud(rng)));
  auto loss = [&](const ref::Problem<mp>& pp) {
    const auto f = ref::forward(pp);
    mp l = 0;
    for (std::size_t t = 0; t < f.out.size(); ++t) l += f.out[t] * dout[t];
    return l;
  };
  const auto g = ref::backward(p, dout);
  const mp h("1e-25");
  double worst = 0;
  auto check = [&](std::vector<mp> ref::Problem<mp>::*field, const std::vector<mp>& grad) {
    mp scale = 0;
    for (const auto& x : grad) scale = std::max(scale, mp(abs(x)));
    for (std::size_t t = 0; t < grad.size(); ++t) {
      auto pp = p, pm = p;
      (pp.*field)[t] += h;
      (pm.*field)[t] -= h;
      const mp fd = (loss(pp) - loss(pm)) / (2 * h);
      worst = std::max(worst, rel_diff(fd, grad[t], scale));
    }
  };
  check(&ref::Problem<mp>::query, g.grad_query);
  check(&ref::Problem<mp>::key, g.grad_key);
  check(&ref::Problem<mp>::value, g.grad_value);
  check(&ref::Problem<mp>::temperature, g.grad_temperature);
  CHECK(worst < 1e-40);
  // MATH.md §7.3: Σ_j dS_ij = 0 in every row.
  for (index_t r = 0; r < 2 * 4; ++r) {
    mp sum = 0, mag = 0;
    for (index_t j = 0; j < 5; ++j) {
      sum += g.grad_scores[static_cast<std::size_t>(r * 5 + j)];
      mag += abs(g.grad_scores[static_cast<std::size_t>(r * 5 + j)]);
    }
    CHECK(static_cast<double>(abs(sum)) <= 1e-70 * (1 + static_cast<double>(mag)));
  }
}

TEST_CASE("reference visibility follows MATH.md §3 written out by hand", "[reference][visibility]") {
  ref::Problem<double> p;
  auto ranges = [&](index_t Lq, index_t Lk) {
    p.len_q = Lq;
    p.len_k = Lk;
    std::vector<std::pair<index_t, index_t>> r;
    for (index_t i = 0; i < Lq; ++i) r.push_back(p.visible(0, i));
    return r;
  };
  using V = std::vector<std::pair<index_t, index_t>>;
  p.causal = true;
  CHECK(ranges(3, 5) == V{{0, 3}, {0, 4}, {0, 5}});          // bottom-right
  CHECK(ranges(1, 5) == V{{0, 5}});                           // decode step sees all
  CHECK(ranges(5, 3) == V{{0, 0}, {0, 0}, {0, 1}, {0, 2}, {0, 3}});  // first rows empty
  p.window_left = 1;  // causal window of 2 keys counting the diagonal
  CHECK(ranges(3, 5) == V{{1, 3}, {2, 4}, {3, 5}});
  p.window_left = 0;
  CHECK(ranges(4, 4) == V{{0, 1}, {1, 2}, {2, 3}, {3, 4}});
  p.causal = false;
  p.window_left = -1;
  CHECK(ranges(2, 3) == V{{0, 3}, {0, 3}});
  // Non-causal windows sit around the diagonal key d = i + Lk - Lq (MATH.md §3).
  p.window_left = p.window_right = 1;  // symmetric: 2w + 1 keys
  CHECK(ranges(4, 4) == V{{0, 2}, {0, 3}, {1, 4}, {2, 4}});
  p.window_left = 1;
  p.window_right = 0;  // = causal with a window of 2 keys
  CHECK(ranges(2, 5) == V{{2, 4}, {3, 5}});
  p.window_left = -1;
  p.window_right = 1;  // unlimited left, one key ahead
  CHECK(ranges(3, 3) == V{{0, 2}, {0, 3}, {0, 3}});
  p.window_left = 0;
  p.window_right = -1;  // the diagonal and everything after it
  CHECK(ranges(3, 5) == V{{2, 5}, {3, 5}, {4, 5}});
  p.window_left = p.window_right = 0;  // Lq > Lk: the first diagonals lie before key 0
  CHECK(ranges(4, 2) == V{{0, 0}, {0, 0}, {0, 1}, {1, 2}});
  p.window_left = p.window_right = -1;
  p.range_lo = {0, 2};
  p.range_hi = {2, 2};
  CHECK(ranges(2, 3) == V{{0, 2}, {2, 2}});
}

TEST_CASE("the library's visible_range equals the reference's, windows up to INT64_MAX", "[reference][visibility]") {
  // attention/visibility.hpp (every backend) against the reference's own
  // long double form, over random shapes, causal or not, and window bounds
  // from unlimited to INT64_MAX (which must neither overflow nor wrap: the
  // dev preset runs this under UBSan).
  constexpr index_t kMax = std::numeric_limits<index_t>::max();
  const index_t bounds[] = {-1, -7, 0, 1, 2, 3, 5, 40, kMax - 1, kMax};
  std::mt19937_64 rng(31);
  ref::Problem<double> p;
  for (int trial = 0; trial < 4000; ++trial) {
    p.len_q = static_cast<index_t>(rng() % 9);
    p.len_k = static_cast<index_t>(rng() % 9);
    p.causal = rng() % 2 == 1;
    p.window_left = bounds[rng() % 10];
    p.window_right = bounds[rng() % 10];
    continuum::Visibility v;
    v.causal = p.causal;
    v.window_left = p.window_left;
    v.window_right = p.window_right;
    for (index_t i = 0; i < p.len_q; ++i) {
      const auto want = p.visible(0, i);
      const auto got = continuum::visible_range(v, 0, i, p.len_q, p.len_k);
      INFO("Lq=" << p.len_q << " Lk=" << p.len_k << " causal=" << p.causal << " window=(" << p.window_left << ","
                 << p.window_right << ") i=" << i);
      CHECK(got.lo == want.first);
      CHECK(got.hi == want.second);
    }
  }
}

TEST_CASE("reference moments: the Taylor branch keeps the working precision (64, 256 and 640 bits)",
          "[reference][moments]") {
  // |a| ≤ 1 takes the Taylor series (reference.hpp); each of the six moments
  // at precision p against its closed form (MATH.md §5) evaluated at 4p + 256
  // bits, where the closed forms' cancellation (≤ 3 log2(1/|a|) bits, 60 at
  // |a| = 2^-20) is absorbed. Bound 2^-(p-8) relative: ~60 rounded additions
  // of partial sums ≤ e·|result| (alternating terms, |a| ≤ 1) give < 2^7 ulp.
  // A fixed count of 80 terms leaves 1/80! ≈ 2^-390 at |a| = 1: too few at 640 bits.
  struct Restore {
    mpfr_prec_t prec = mp::get_default_prec();
    ~Restore() { mp::set_default_prec(prec); }
  } restore;
  using M = mp (*)(const mp&);
  struct Moment {
    const char* name;
    M reference;
    M closed;  // MATH.md §5, in the precision of its argument
  };
  const Moment moments[] = {
      {"mu0", ref::moments::mu0<mp>, [](const mp& a) { return mp(expm1(a) / a); }},
      {"mu1", ref::moments::mu1<mp>, [](const mp& a) { return mp((a * exp(a) - expm1(a)) / (a * a)); }},
      {"mu2", ref::moments::mu2<mp>,
       [](const mp& a) { return mp((exp(a) * ((a - 2) * a + 2) - 2) / (a * a * a)); }},
      {"nu", ref::moments::nu<mp>, [](const mp& a) { return mp((expm1(a) - a) / (a * a)); }},
      {"kappa", ref::moments::kappa<mp>, [](const mp& a) { return mp(((a - 2) * exp(a) + a + 2) / (a * a * a)); }},
      {"nu2", ref::moments::nu2<mp>,
       [](const mp& a) { return mp(-((a + 2) * a + 2 - 2 * exp(a)) / (a * a * a)); }},
  };
  for (const mpfr_prec_t p : {64, 256, 640})
    for (const double a : {-1.0, -0.75, -0.3, -1e-3, -0x1p-20, 0x1p-20, 0.5, 1.0})
      for (const Moment& m : moments) {
        mp::set_default_prec(p);
        const mp got = m.reference(mp(a));
        mp::set_default_prec(4 * p + 256);
        const mp want = m.closed(mp(a));
        const double rel = static_cast<double>(abs(mp(got) - want) / abs(want));
        INFO(m.name << "(" << a << ") at " << p << " bits: relative error " << rel);
        CHECK(rel <= std::ldexp(1.0, -int(p) + 8));
      }
}

TEST_CASE("long double reference agrees with the 256-bit reference", "[reference]") {
  precision();
  // The long double reference is used for shapes too large for mpreal. Its
  // moments keep ≥ 59 bits (reference.hpp), sums of ≤ 64 terms lose ≤ 6 bits,
  // and the scores (|s| ≤ 10) carry 10·ε_ld: 1e-16 relative is a safe bound.
  auto rng = std::mt19937_64(4242);
  auto pm = random_problem<mp>(rng, 9, 11, 5, 2.0, 2, 1, 3);
  pm.causal = true;
  ref::Problem<long double> pl;
  pl.heads_q = 2;
  pl.len_q = 9;
  pl.len_k = 11;
  pl.dim = 5;
  pl.dim_v = 3;
  pl.causal = true;
  for (const auto& x : pm.query) pl.query.push_back(x.toLDouble());
  for (const auto& x : pm.key) pl.key.push_back(x.toLDouble());
  for (const auto& x : pm.value) pl.value.push_back(x.toLDouble());
  pl.scale = 1.0L / std::sqrt(5.0L);
  std::vector<mp> dm;
  std::vector<long double> dl;
  std::uniform_real_distribution<double> ud(-1, 1);
  for (int t = 0; t < 2 * 9 * 3; ++t) {
    const double x = ud(rng);
    dm.push_back(mp(x));
    dl.push_back(x);
  }
  const auto fm = ref::forward(pm);
  const auto fl = ref::forward(pl);
  const auto gm = ref::backward(pm, dm);
  const auto gl = ref::backward(pl, dl);
  auto err = [](const std::vector<mp>& a, const std::vector<long double>& b) {
    long double worst = 0, scale = 0;
    for (std::size_t t = 0; t < a.size(); ++t) {
      scale = std::max(scale, std::fabs(a[t].toLDouble()));
      worst = std::max(worst, std::fabs(a[t].toLDouble() - b[t]));
    }
    return static_cast<double>(worst / (scale > 0 ? scale : 1));
  };
  CHECK(err(fm.out, fl.out) < 1e-16);
  CHECK(err(fm.lse, fl.lse) < 1e-16);
  CHECK(err(fm.probs, fl.probs) < 1e-16);
  CHECK(err(gm.grad_query, gl.grad_query) < 1e-16);
  CHECK(err(gm.grad_key, gl.grad_key) < 1e-16);
  CHECK(err(gm.grad_value, gl.grad_value) < 1e-16);
  CHECK(err(gm.grad_temperature, gl.grad_temperature) < 1e-16);
}

TEST_CASE("reference softmax kernel is softmax", "[reference]") {
  ref::Problem<long double> p;
  p.len_q = 1;
  p.len_k = 3;
  p.dim = 1;
  p.dim_v = 1;
  p.query = {1};
  p.key = {0.5L, -1, 2};
  p.value = {1, 2, 3};
  p.scale = 1;
  p.kernel = continuum::Kernel::softmax;
  const auto f = ref::forward(p);
  const long double z = std::exp(0.5L) + std::exp(-1.0L) + std::exp(2.0L);
  CHECK(std::fabs(f.probs[0] - std::exp(0.5L) / z) < 1e-18L);
  CHECK(std::fabs(f.lse[0] - std::log(z)) < 1e-18L);
}
