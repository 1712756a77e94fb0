// Operator forward (CPU) against the 256-bit reference fed the same rounded
// inputs (MATH.md §3–§5): random and adversarial inputs, float and double.
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
  const int vis = GENERATE(0, 1, 2, 3, 4, 5, 6);
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
  // empty rows: output exactly 0, lse = -inf (MATH.md §3)
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

TEMPLATE_TEST_CASE("forward across key and query tiles with explicit ranges", "[operator][forward][tiles]", float,
                   double) {
  // Lk beyond one key tile (the forward tiles keys by kBc = 512 with a
  // one-column halo, queries in GEMM sub-blocks of 64; the bfloat16 units take
  // 16-key blocks): random ranges that start and end on both sides of tile
  // boundaries, windows, GQA, per-query τ. long double reference (the shapes
  // are too large for mpreal to be quick; it agrees with the 256-bit
  // reference to 1e-16, test_reference_quadrature).
  const auto shape = GENERATE(std::make_pair(33, 130), std::make_pair(17, continuum::cpu_detail::tiled::kBc + 40),
                              std::make_pair(70, 65));
  const int mode = GENERATE(0, 1, 2);  // 0: explicit ranges, 1: causal W=70, 2: causal + ranges
  Case<TestType> c;
  c.B = 2;
  c.Hq = 2;
  c.Hk = 1;
  c.Lq = shape.first;
  c.Lk = shape.second;
  c.D = 9;
  c.Dv = 4;
  c.tshape = continuum::TemperatureShape::per_query;
  auto rng = rng_for(static_cast<std::uint64_t>(shape.first * 1000 + shape.second * 7 + mode));
  if (mode != 1) random_ranges(c, rng);
  if (mode >= 1) {
    c.vis.causal = true;
    c.vis.window_left = mode == 1 ? 69 : -1;  // 70 keys
  }
  c.want_maps = true;
  c.alloc();
  c.fill_uniform(rng, -1.5, 1.5);
  random_taus(c, rng, 0.3, 2.0);
  check_forward<long double>(c, "tiles");
}

TEMPLATE_TEST_CASE("forward and backward on packed QKV and zero-stride (broadcast) views",
                   "[operator][forward][backward][layout]", float, double) {
  use_mp_precision();
  // Packed [B, S, 3, H, D] buffer: Q, K, V are views with stride_seq = 3·H·D
  // into the same memory; and a K/V view with stride_head = 0 (one head's
  // keys broadcast to every KV head). The reference reads the same views.
  const bool broadcast = GENERATE(false, true);
  const index_t B = 2, S = 9, H = 2, D = 5;
  std::vector<TestType> qkv(static_cast<std::size_t>(B * S * 3 * H * D));
  auto rng = rng_for(808 + broadcast);
  std::uniform_real_distribution<double> u(-1, 1);
  for (auto& x : qkv) x = static_cast<TestType>(u(rng));
  auto view = [&](index_t part) {
    continuum::TensorView<const TestType> v{qkv.data() + part * H * D, B, H, S, D, S * 3 * H * D, D, 3 * H * D};
    if (broadcast && part > 0) v.stride_head = 0;
    return v;
  };
  Case<TestType> c;
  c.B = B;
  c.Hq = c.Hk = H;
  c.Lq = c.Lk = S;
  c.D = c.Dv = D;
  c.vis.causal = true;
  c.alloc();
  c.fill_uniform(rng);  // dout (q/k/v of the case are replaced by the views)
  auto fa = c.forward_args();
  fa.query = view(0);
  fa.key = view(1);
  fa.value = view(2);
  continuum::attention_forward(continuum::cpu, fa);
  auto ba = c.backward_args();
  ba.query = fa.query;
  ba.key = fa.key;
  ba.value = fa.value;
  if (broadcast) {  // gradients of a broadcast view: write per-head grads
    ba.grad_key = c.dk.view;
    ba.grad_value = c.dv.view;
  }
  continuum::attention_backward(continuum::cpu, ba);
  const auto p = continuum::reference::from_args<mp>(fa);
  const auto f = continuum::reference::forward(p);
  const auto g = continuum::reference::backward(p, c.template grad_out_ref<mp>());
  const double tol = forward_tolerance<TestType>(max_abs(f.scores), D);
  const double btol = backward_tolerance<TestType>(max_abs(f.scores), D);
  const Error eo = compare(c.o.contiguous(), f.out);
  const Error eq = compare(c.dq.contiguous(), g.grad_query);
  const Error ek = compare(c.dk.contiguous(), g.grad_key);
  const Error ev = compare(c.dv.contiguous(), g.grad_value);
  INFO("broadcast " << broadcast << " out " << eo.rel() << " dQ " << eq.rel() << " dK " << ek.rel() << " dV "
                    << ev.rel());
  CHECK(eo.max_abs <= tol * eo.ref_scale);
  CHECK(eq.max_abs <= btol * eq.ref_scale);
  CHECK(ek.max_abs <= btol * ek.ref_scale);
  CHECK(ev.max_abs <= btol * ev.ref_scale);
}
