// The invariants of MATH.md §7 as property tests of the CPU operator (and, where
// the invariant is about the definition, of the reference). Random inputs via
// GENERATE(take(N, random(a, b))) with Catch's fixed default seed, plus our own
// seeded generators for the tensors.
#include <catch2/catch.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "operator/harness.hpp"

using namespace harness;
using continuum::index_t;
using continuum::TemperatureShape;

// §7.1 -----------------------------------------------------------------------
TEMPLATE_TEST_CASE("MATH.md §7.1 one visible key gives o = v exactly", "[property][7.1]", float, double) {
  const double amp = GENERATE(take(12, random(0.01, 30.0)));
  const index_t L = GENERATE(1, 6);
  Case<TestType> c;
  c.Lq = c.Lk = L;
  c.D = 5;
  c.Dv = 3;
  c.vis.causal = true;
  c.vis.window_left = 0;  // each row sees only its own key (for L = 1: the one key)
  c.alloc();
  auto rng = rng_for(static_cast<std::uint64_t>(amp * 1000));
  c.fill_uniform(rng, -amp, amp);
  c.forward();
  for (index_t i = 0; i < L; ++i)
    for (index_t d = 0; d < 3; ++d) {
      INFO("amp=" << amp << " row " << i);
      CHECK(c.o.at(0, 0, i, d) == c.v.at(0, 0, i, d));
    }
}

// §7.2 -----------------------------------------------------------------------
TEMPLATE_TEST_CASE("MATH.md §7.2 equal scores give P = 1/(hi - lo), as softmax", "[property][7.2]", float,
                   double) {
  const int n = GENERATE(take(10, random(1, 40)));
  const int vis = GENERATE(0, 1, 4);
  Case<TestType> c;
  c.Lq = 3;
  c.Lk = n;
  c.D = 4;
  c.vis = visibility_code(vis);
  c.want_maps = true;
  c.alloc();
  auto rng = rng_for(static_cast<std::uint64_t>(n + 100 * vis));
  c.fill_uniform(rng);
  c.q.zero();  // q = 0: every score 0
  c.forward();
  const auto p = c.template problem<long double>();
  for (index_t i = 0; i < c.Lq; ++i) {
    const auto r = p.visible(0, i);
    const double m = static_cast<double>(r.second - r.first);
    for (index_t j = r.first; j < r.second; ++j) {
      INFO("n=" << n << " row " << i << " key " << j);
      CHECK_THAT(double(c.probs[static_cast<std::size_t>(i * n + j)]), Catch::Matchers::WithinRel(1.0 / m, 8 * eps<TestType>()));
      CHECK_THAT(double(c.cell[static_cast<std::size_t>(i * n + j)]), Catch::Matchers::WithinRel(1.0 / m, 8 * eps<TestType>()));
    }
  }
}

// §7.3 -----------------------------------------------------------------------
TEMPLATE_TEST_CASE("MATH.md §7.3 adding a constant to a row's scores changes nothing", "[property][7.3]", float,
                   double) {
  // An extra dimension with k_extra = 1 and q_extra = C / scale adds C to every
  // score of the row. o must not move beyond forward_tolerance(|C| + max|s|);
  // lse moves by exactly C (to the same tolerance).
  const double C = GENERATE(take(8, random(-60.0, 60.0)));
  Case<TestType> a, b;
  for (Case<TestType>* c : {&a, &b}) {
    c->Lq = 5;
    c->Lk = 7;
    c->D = 4;
    c->scale = 0.5;
    c->vis.causal = true;
    c->alloc();
  }
  // (via int64: a negative double converted straight to unsigned is UB)
  auto rng = rng_for(static_cast<std::uint64_t>(static_cast<std::int64_t>(C * 1e6)));
  a.fill_uniform(rng);
  b.fill_uniform(rng);
  for (index_t i = 0; i < 5; ++i)
    for (index_t d = 0; d < 4; ++d) {
      b.q.at(0, 0, i, d) = d < 3 ? a.q.at(0, 0, i, d) : static_cast<TestType>(C / 0.5);
      a.q.at(0, 0, i, d) = d < 3 ? a.q.at(0, 0, i, d) : TestType(0);
    }
  for (index_t j = 0; j < 7; ++j)
    for (index_t d = 0; d < 4; ++d) {
      b.k.at(0, 0, j, d) = d < 3 ? a.k.at(0, 0, j, d) : TestType(1);
      a.k.at(0, 0, j, d) = d < 3 ? a.k.at(0, 0, j, d) : TestType(1);
      b.v.at(0, 0, j, d) = a.v.at(0, 0, j, d);
    }
  a.forward();
  b.forward();
  const double tol = forward_tolerance<TestType>(std::fabs(C) + 2, 4);
  const Error e = compare(b.o.contiguous(), a.o.contiguous());
  INFO("C=" << C << " err " << e.max_abs << " tol " << tol);
  CHECK(e.max_abs <= tol * e.ref_scale);
  for (index_t i = 0; i < 5; ++i)
    CHECK(std::fabs(double(b.lse[static_cast<std::size_t>(i)]) - double(a.lse[static_cast<std::size_t>(i)]) - C) <=
          tol * (1 + std::fabs(C)));
}

TEST_CASE("MATH.md §7.3 sum_j dS_ij = 0: reference rows, and the operator's sum_j dK_j = 0", "[property][7.3]") {
  use_mp_precision();
  const int seed = GENERATE(take(8, random(0, 1000000)));
  Case<double> c;
  c.Lq = 6;
  c.Lk = 9;
  c.D = 3;
  c.vis = visibility_code(seed % 6);
  c.tshape = TemperatureShape::per_query;
  c.alloc();
  auto rng = rng_for(static_cast<std::uint64_t>(seed));
  c.fill_uniform(rng, -2, 2);
  random_taus(c, rng, 0.2, 2);
  const auto p = c.problem<mp>();
  const auto g = continuum::reference::backward(p, c.grad_out_ref<mp>());
  for (index_t i = 0; i < c.Lq; ++i) {
    mp sum = 0, mag = 0;
    for (index_t j = 0; j < c.Lk; ++j) {
      sum += g.grad_scores[static_cast<std::size_t>(i * c.Lk + j)];
      mag += abs(g.grad_scores[static_cast<std::size_t>(i * c.Lk + j)]);
    }
    CHECK(abs(sum).toDouble() <= 1e-70 * (1 + mag.toDouble()));
  }
  // Operator: Σ_j dK_j = Σ_i c_i (Σ_j dS_ij) q_i = 0 (one head, no GQA).
  c.forward();
  c.backward();
  for (index_t d = 0; d < c.D; ++d) {
    double sum = 0, mag = 0;
    for (index_t j = 0; j < c.Lk; ++j) {
      sum += c.dk.at(0, 0, j, d);
      mag += std::fabs(c.dk.at(0, 0, j, d));
    }
    INFO("seed " << seed << " d " << d << " sum " << sum << " mag " << mag);
    CHECK(std::fabs(sum) <= 64 * eps<double>() * (1 + mag) * c.Lk);
  }
}

// §7.4 -----------------------------------------------------------------------
TEMPLATE_TEST_CASE("MATH.md §7.4 P and pi are non-negative and rows sum to 1", "[property][7.4]", float, double) {
  const double amp = GENERATE(take(10, random(0.1, 6.0)));
  const int vis = GENERATE(0, 1, 3, 4, 5);
  Case<TestType> c;
  c.Hq = 2;
  c.Lq = 9;
  c.Lk = 13;
  c.D = 6;
  c.vis = visibility_code(vis);
  c.want_maps = true;
  c.alloc();
  auto rng = rng_for(static_cast<std::uint64_t>(amp * 1e5) + vis);
  c.fill_uniform(rng, -amp, amp);
  c.forward();
  for (index_t r = 0; r < c.Hq * c.Lq; ++r) {
    double sp = 0, sc = 0;
    bool any = false;
    for (index_t j = 0; j < c.Lk; ++j) {
      const double p = c.probs[static_cast<std::size_t>(r * c.Lk + j)], m = c.cell[static_cast<std::size_t>(r * c.Lk + j)];
      CHECK(p >= 0);
      CHECK(m >= 0);
      sp += p;
      sc += m;
      any = any || p > 0;
    }
    if (!any) continue;  // empty row
    INFO("amp=" << amp << " vis=" << vis << " row " << r);
    CHECK_THAT(sp, Catch::Matchers::WithinAbs(1.0, 4 * c.Lk * eps<TestType>()));
    CHECK_THAT(sc, Catch::Matchers::WithinAbs(1.0, 4 * c.Lk * eps<TestType>()));
  }
}

TEMPLATE_TEST_CASE("inspection maps P and pi change no bit of out and lse", "[property][maps]", float, double) {
  // The maps come from the same kernels as the output (MATH.md §10): asking
  // for them must not change how out and lse are computed. Lk = kBc + 88
  // spans two key tiles; query row 5 of head 1 is scaled so that its scores
  // exceed 4096 (float and double rows then go to the next wider type, whose
  // maps must also reach the caller).
  use_mp_precision();
  const int vis = GENERATE(0, 1, 3, 4, 5);
  const auto kernel = GENERATE(continuum::Kernel::continuum, continuum::Kernel::softmax);
  const auto compute = GENERATE(continuum::Compute::automatic, continuum::Compute::float64);
  if (std::is_same<TestType, double>::value && compute == continuum::Compute::float64) return;
  Case<TestType> c;
  c.Hq = 2;
  c.Hk = 1;
  c.Lq = 40;
  c.Lk = continuum::cpu_detail::tiled::kBc + 88;
  c.D = 6;
  c.kernel = kernel;
  c.compute = compute;
  c.vis = visibility_code(vis);
  c.want_maps = true;  // allocates P and π
  c.alloc();
  auto rng = rng_for(77 + std::uint64_t(vis));
  c.fill_uniform(rng, -2, 2);
  for (index_t d = 0; d < c.D; ++d) c.q.at(0, 1, 5, d) *= TestType(3000);
  c.want_maps = false;
  c.forward();
  const std::vector<TestType> o = c.o.contiguous(), lse = c.lse;
  c.want_maps = true;
  c.forward();
  INFO("vis " << vis << " kernel " << continuum::kernel_name(kernel));
  CHECK(bitwise_equal(c.o.contiguous(), o));
  CHECK(bitwise_equal(c.lse, lse));
  // The scaled row's maps are there (its P sums to 1), and match the reference.
  const std::size_t row = std::size_t(1 * c.Lq + 5);
  double sp = 0;
  for (index_t j = 0; j < c.Lk; ++j) sp += double(c.probs[row * std::size_t(c.Lk) + std::size_t(j)]);
  if (lse[row] > -std::numeric_limits<TestType>::infinity())
    CHECK_THAT(sp, Catch::Matchers::WithinAbs(1.0, 4 * c.Lk * eps<TestType>()));
  check_forward<mp>(c, "maps");
}

// §7.5 -----------------------------------------------------------------------
TEMPLATE_TEST_CASE("MATH.md §7.5 reversing keys and window reverses P, order matters", "[property][7.5]", float,
                   double) {
  const int seed = GENERATE(take(10, random(0, 1000000)));
  const index_t Lk = 8;
  Case<TestType> a, b;
  auto rng = rng_for(static_cast<std::uint64_t>(seed));
  std::vector<index_t> lo, hi;
  for (index_t i = 0; i < 4; ++i) {
    const index_t l = static_cast<index_t>(rng() % 5);
    lo.push_back(l);
    hi.push_back(l + 1 + static_cast<index_t>(rng() % static_cast<unsigned>(Lk - l)));
  }
  for (Case<TestType>* c : {&a, &b}) {
    c->Lq = 4;
    c->Lk = Lk;
    c->D = 3;
    c->want_maps = true;
    c->alloc();
  }
  a.range_lo = lo;
  a.range_hi = hi;
  for (index_t i = 0; i < 4; ++i) {  // the reversed window
    b.range_lo.push_back(Lk - hi[static_cast<std::size_t>(i)]);
    b.range_hi.push_back(Lk - lo[static_cast<std::size_t>(i)]);
  }
  a.fill_uniform(rng, -2, 2);
  b.q = a.q;
  for (index_t j = 0; j < Lk; ++j)
    for (index_t d = 0; d < 3; ++d) {
      b.k.at(0, 0, Lk - 1 - j, d) = a.k.at(0, 0, j, d);
      b.v.at(0, 0, Lk - 1 - j, d) = a.v.at(0, 0, j, d);
    }
  a.forward();
  b.forward();
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 0; j < Lk; ++j)
      CHECK_THAT(double(b.probs[static_cast<std::size_t>(i * Lk + Lk - 1 - j)]),
                 Catch::Matchers::WithinAbs(double(a.probs[static_cast<std::size_t>(i * Lk + j)]), 8 * eps<TestType>()));
  const Error e = compare(b.o.contiguous(), a.o.contiguous());
  CHECK(e.max_abs <= 16 * eps<TestType>() * e.ref_scale);
  // Order matters: swapping keys 1 and 5 (with their values) does not just
  // permute P, unlike softmax (checked on the same input with the softmax kernel).
  for (auto kernel : {continuum::Kernel::continuum, continuum::Kernel::softmax}) {
    Case<TestType> x = a, y = a;
    x.range_lo.clear();
    x.range_hi.clear();
    y.range_lo.clear();
    y.range_hi.clear();
    x.kernel = y.kernel = kernel;
    for (index_t d = 0; d < 3; ++d) {
      std::swap(y.k.at(0, 0, 1, d), y.k.at(0, 0, 5, d));
      std::swap(y.v.at(0, 0, 1, d), y.v.at(0, 0, 5, d));
    }
    x.forward();
    y.forward();
    double diff = 0;
    for (index_t i = 0; i < 4; ++i)
      for (index_t j = 0; j < Lk; ++j) {
        const index_t jp = j == 1 ? 5 : j == 5 ? 1 : j;
        diff = std::max(diff, std::fabs(double(x.probs[static_cast<std::size_t>(i * Lk + j)]) -
                                        double(y.probs[static_cast<std::size_t>(i * Lk + jp)])));
      }
    if (kernel == continuum::Kernel::softmax) CHECK(diff <= 8 * eps<TestType>());
    else CHECK(diff > 1e-3);
  }
}

// §7.6 -----------------------------------------------------------------------
TEMPLATE_TEST_CASE("MATH.md §7.6 tau -> 0: neighbour weight O(tau), at the predicted rate", "[property][7.6]",
                   float, double) {
  // One row, scores at τ = 1: s¹ = (…, m - Δ_L, m, m - Δ_R, …) with the maximum
  // inside. As τ → 0, up to terms e^{-Δ/τ}:
  //   P_left  = τ · (1/Δ_L²) / (1/Δ_L + 1/Δ_R),  P_right likewise with Δ_R,
  // since Z ≈ e^{m/τ}(μ0(-δ_L) + μ0(-δ_R)) and the neighbour's weight is
  // e^{m/τ} μ1(-δ), with μ0(-δ) = (1 - e^{-δ})/δ, μ1(-δ) = 1/δ² - e^{-δ}(1/δ + 1/δ²).
  // At τ ≤ 0.01 and Δ ≥ 0.4 the e^{-Δ/τ} terms are < 1e-17: the rate is exact
  // to rounding. Softmax's neighbour weight would be ~e^{-Δ/τ}.
  const double dl = GENERATE(take(5, random(0.4, 3.0)));
  const double dr = GENERATE(take(3, random(0.4, 3.0)));
  const double tau = GENERATE(1e-2, 1e-3, 1e-4);
  Case<TestType> c;
  c.Lq = 1;
  c.Lk = 5;
  c.D = 1;
  c.Dv = 1;
  c.scale = 1.0;
  c.tau = static_cast<TestType>(tau);
  c.want_maps = true;
  c.alloc();
  const double s1[5] = {1 - dl - 1, 1 - dl, 1, 1 - dr, 1 - dr - 0.5};
  c.q.at(0, 0, 0, 0) = TestType(1);
  for (index_t j = 0; j < 5; ++j) {
    c.k.at(0, 0, j, 0) = static_cast<TestType>(s1[j]);
    c.v.at(0, 0, j, 0) = TestType(0);
  }
  c.forward();
  // use the rounded inputs to predict
  const double DL = double(c.k.at(0, 0, 2, 0)) - double(c.k.at(0, 0, 1, 0));
  const double DR = double(c.k.at(0, 0, 2, 0)) - double(c.k.at(0, 0, 3, 0));
  const double t = double(c.tau);
  const double pl = t * (1 / (DL * DL)) / (1 / DL + 1 / DR), pr = t * (1 / (DR * DR)) / (1 / DL + 1 / DR);
  INFO("dl=" << DL << " dr=" << DR << " tau=" << t << " P=" << c.probs[1] << "," << c.probs[2] << "," << c.probs[3]);
  // relative error: forward tolerance at max|s| = 1/τ, plus δ-sensitivity 1.
  const double tol = 64 * eps<TestType>() * (1 + 3 / std::min(DL, DR));
  CHECK_THAT(double(c.probs[1]), Catch::Matchers::WithinRel(pl, tol));
  CHECK_THAT(double(c.probs[3]), Catch::Matchers::WithinRel(pr, tol));
  CHECK(double(c.probs[0]) <= 1e-15);
  CHECK(double(c.probs[4]) <= 1e-15);
}

// §7.7 -----------------------------------------------------------------------
TEST_CASE("MATH.md §7.7 w(x,y) + w(y,x) = e^max mu0(-|x-y|) and dw/dx + dw/dy = w", "[property][7.7]") {
  use_mp_precision();
  const double x = GENERATE(take(40, random(-30.0, 0.0)));
  const double dy = GENERATE(0.0, 1e-13, 1e-7, 1e-3, 0.5, 3.0, 40.0);
  const double y = x - dy;
  namespace ref = continuum::reference;
  // reference (256 bits)
  const mp X(x), Y(y);
  const mp m = X < Y ? Y : X;
  const mp lhs = ref::segment_weight(X, Y) + ref::segment_weight(Y, X);
  const mp rhs = exp(m) * ref::moments::mu0(-abs(X - Y));
  CHECK(abs(lhs - rhs).toDouble() <= 1e-70 * rhs.toDouble());
  const mp d = ref::segment_weight_dx(X, Y) + ref::segment_weight_dy(X, Y) - ref::segment_weight(X, Y);
  CHECK(abs(d).toDouble() <= 1e-70 * ref::segment_weight(X, Y).toDouble());
  // the library's double primitives, a few ulp
  const double l = continuum::segment_weight(x, y) + continuum::segment_weight(y, x);
  INFO("x=" << x << " y=" << y);
  CHECK_THAT(l, Catch::Matchers::WithinRel(rhs.toDouble(), 8 * eps<double>()));
  const double s = continuum::segment_weight_dx(x, y) + continuum::segment_weight_dy(x, y);
  CHECK_THAT(s, Catch::Matchers::WithinRel(ref::segment_weight(X, Y).toDouble(), 8 * eps<double>()));
  const double s2 = continuum::segment_weight_dx(y, x) + continuum::segment_weight_dy(y, x);
  CHECK_THAT(s2, Catch::Matchers::WithinRel(ref::segment_weight(Y, X).toDouble(), 8 * eps<double>()));
}

// §7.9 -----------------------------------------------------------------------
TEMPLATE_TEST_CASE("MATH.md §7.9 KV-cache decode rows equal the full causal forward", "[property][7.9]", float,
                   double) {
  const int L = GENERATE(take(6, random(1, 48)));
  const int W = GENERATE(0, 1, 3);
  Case<TestType> full;
  full.Hq = 2;
  full.Hk = 1;
  full.Lq = full.Lk = L;
  full.D = 8;
  full.vis.causal = true;
  full.vis.window_left = W - 1;  // W keys; 0: no window
  full.alloc();
  auto rng = rng_for(static_cast<std::uint64_t>(L * 10 + W));
  full.fill_uniform(rng);
  full.forward();
  const double tol = sizeof(TestType) == 4 ? 1e-6 : 1e-13;
  for (index_t t = 0; t < L; ++t) {
    std::vector<TestType> out, lse;  // [1, 2, 1, 8], [1, 2]
    continuum::attention_forward(continuum::cpu, decode_step_args(full, t, out, lse));
    for (index_t h = 0; h < 2; ++h) {
      double e = 0, s = 0;
      for (index_t d = 0; d < 8; ++d) {
        e = std::max(e, std::fabs(double(out[static_cast<std::size_t>(h * 8 + d)]) - double(full.o.at(0, h, t, d))));
        s = std::max(s, std::fabs(double(full.o.at(0, h, t, d))));
      }
      INFO("L=" << L << " W=" << W << " step " << t << " head " << h);
      CHECK(e <= tol * s);
      // And bit for bit (README, MATH.md §7.9): the step's rows are computed
      // with the same tiles as in the full forward, although the step puts
      // both query heads of the GQA group into one task (tiled.hpp).
      for (index_t d = 0; d < 8; ++d) {
        const TestType x = out[static_cast<std::size_t>(h * 8 + d)], y = full.o.at(0, h, t, d);
        CHECK(std::memcmp(&x, &y, sizeof(TestType)) == 0);
      }
      const TestType l = lse[static_cast<std::size_t>(h)], lf = full.lse[static_cast<std::size_t>(h * L + t)];
      CHECK(std::memcmp(&l, &lf, sizeof(TestType)) == 0);
    }
  }
}

// §7.10 ----------------------------------------------------------------------
TEMPLATE_TEST_CASE("MATH.md §7.10 thread counts 1, 2, 3 give bitwise identical results", "[property][7.10]", float,
                   double) {
  const int vis = GENERATE(0, 1, 4);
  Case<TestType> c;
  c.B = 2;
  c.Hq = 4;
  c.Hk = 2;
  c.Lq = 70;
  c.Lk = 150;
  c.D = 16;
  c.Dv = 8;
  c.vis = visibility_code(vis);
  c.tshape = TemperatureShape::per_head;
  c.alloc();
  auto rng = rng_for(1010 + vis);
  c.fill_uniform(rng);
  c.taus = {static_cast<TestType>(0.3), TestType(1), TestType(2), static_cast<TestType>(0.7)};
  std::vector<TestType> o1, l1, q1, k1, v1, t1;
  for (int threads : {1, 2, 3, 0}) {
    c.threads = threads;
    c.forward();
    c.backward();
    if (threads == 1) {
      o1 = c.o.buf, l1 = c.lse, q1 = c.dq.buf, k1 = c.dk.buf, v1 = c.dv.buf, t1 = c.dtau;
      continue;
    }
    INFO("threads " << threads);
    CHECK(bitwise_equal(c.o.buf, o1));
    CHECK(bitwise_equal(c.lse, l1));
    CHECK(bitwise_equal(c.dq.buf, q1));
    CHECK(bitwise_equal(c.dk.buf, k1));
    CHECK(bitwise_equal(c.dv.buf, v1));
    CHECK(bitwise_equal(c.dtau, t1));
  }
}

TEST_CASE("MATH.md §7.10 calling from inside the caller's own omp parallel region", "[property][7.10]") {
  // Each thread of the caller's region runs its own problem; the results equal
  // the serial call's bitwise (no nested-parallelism deadlock or race).
  constexpr int n = 4;
  std::vector<Case<double>> cases(n), serial(n);
  for (int t = 0; t < n; ++t) {
    Case<double>& c = cases[static_cast<std::size_t>(t)];
    c.Hq = 2;
    c.Lq = 40 + t;
    c.Lk = 90;
    c.D = 8;
    c.vis.causal = t % 2 == 1;
    c.alloc();
    auto rng = rng_for(static_cast<std::uint64_t>(2000 + t));
    c.fill_uniform(rng);
    serial[static_cast<std::size_t>(t)] = c;
    serial[static_cast<std::size_t>(t)].threads = 1;
    serial[static_cast<std::size_t>(t)].forward();
    serial[static_cast<std::size_t>(t)].backward();
  }
  int failures = 0;
#if defined(_OPENMP)
#pragma omp parallel for num_threads(2) schedule(static, 1) reduction(+ : failures)
#endif
  for (int t = 0; t < n; ++t) {
    try {
      cases[static_cast<std::size_t>(t)].forward();
      cases[static_cast<std::size_t>(t)].backward();
    } catch (...) {
      ++failures;
    }
  }
  CHECK(failures == 0);
  for (int t = 0; t < n; ++t) {
    INFO("problem " << t);
    CHECK(bitwise_equal(cases[static_cast<std::size_t>(t)].o.buf, serial[static_cast<std::size_t>(t)].o.buf));
    CHECK(bitwise_equal(cases[static_cast<std::size_t>(t)].dq.buf, serial[static_cast<std::size_t>(t)].dq.buf));
    CHECK(bitwise_equal(cases[static_cast<std::size_t>(t)].dk.buf, serial[static_cast<std::size_t>(t)].dk.buf));
    CHECK(bitwise_equal(cases[static_cast<std::size_t>(t)].dv.buf, serial[static_cast<std::size_t>(t)].dv.buf));
  }
}

// Random configurations -------------------------------------------------------
TEMPLATE_TEST_CASE("random configurations: forward and backward equal the reference", "[property][fuzz]", float,
                   double) {
  // Each seed draws a whole configuration: sizes (Lq, Lk across the 16/64
  // tile sizes, 0 included), GQA ratio, D ≠ Dv, BHSD/BSHD with padding,
  // visibility (full / causal / window / explicit ranges), kernel, the
  // temperature's shape and values, thread count. long double reference;
  // tolerances as in the operator tests (harness.hpp).
  const int seed = GENERATE(take(100, random(0, 1000000000)));
  auto rng = rng_for(static_cast<std::uint64_t>(seed));
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  Case<TestType> c;
  c.B = 1 + pick(2);
  c.Hk = 1 + pick(2);
  c.Hq = c.Hk * (1 + pick(3));
  const int lens[] = {0, 1, 2, 5, 15, 16, 17, 63, 65, 100};
  c.Lq = lens[pick(10)];
  c.Lk = lens[pick(10)];
  c.D = 1 + pick(20);
  c.Dv = 1 + pick(9);
  c.bshd = pick(2) == 1;
  c.pad = pick(3);
  const int vis = pick(4);
  c.vis.causal = vis == 1 || vis == 2;
  c.vis.window_left = vis == 2 ? pick(8) : -1;
  if (vis == 3)
    for (index_t b = 0; b < c.B; ++b)
      for (index_t i = 0; i < c.Lq; ++i) {
        const index_t lo = c.Lk ? pick(static_cast<int>(c.Lk) + 1) : 0;
        c.range_lo.push_back(lo);
        c.range_hi.push_back(lo + pick(static_cast<int>(c.Lk - lo) + 1));
      }
  c.kernel = pick(4) == 0 ? continuum::Kernel::softmax : continuum::Kernel::continuum;
  c.tshape = static_cast<TemperatureShape>(pick(3));
  c.threads = pick(4);
  c.want_maps = true;
  c.alloc();
  c.fill_uniform(rng, -1.5, 1.5);
  random_temperatures(c, rng, 0.2, 2.0);
  INFO("seed " << seed << " B=" << c.B << " Hq=" << c.Hq << " Hk=" << c.Hk << " Lq=" << c.Lq << " Lk=" << c.Lk
               << " D=" << c.D << " Dv=" << c.Dv << " bshd=" << c.bshd << " pad=" << c.pad << " vis=" << vis
               << " kernel=" << static_cast<int>(c.kernel) << " tshape=" << static_cast<int>(c.tshape)
               << " threads=" << c.threads);
  check_forward<long double>(c, "fuzz");
  check_backward<long double>(c, "fuzz");
}
