// Invalid arguments (issue 2 item 6): every kind throws std::invalid_argument
// whose message names the argument; non-finite values in Q/K/V reach only the
// rows that see them.
#include <catch2/catch.hpp>

#include <set>

#include "operator/harness.hpp"

using namespace harness;
using continuum::index_t;
using continuum::TemperatureShape;

namespace {

/// Matcher: std::invalid_argument whose message contains `name`.
struct Names : Catch::MatcherBase<std::invalid_argument> {
  std::string name;
  explicit Names(std::string n) : name(std::move(n)) {}
  bool match(const std::invalid_argument& e) const override {
    return std::string(e.what()).find(name) != std::string::npos;
  }
  std::string describe() const override { return "message names \"" + name + "\""; }
};

Case<double> valid_case() {
  Case<double> c;
  c.B = 2;
  c.Hq = 4;
  c.Hk = 2;
  c.Lq = 5;
  c.Lk = 6;
  c.D = 3;
  c.Dv = 2;
  c.alloc();
  auto rng = rng_for(31);
  c.fill_uniform(rng);
  return c;
}

}  // namespace

TEST_CASE("bad input: the valid base case runs", "[bad-input]") {
  auto c = valid_case();
  CHECK_NOTHROW(c.forward());
  CHECK_NOTHROW(c.backward());
}

TEST_CASE("bad input: forward arguments", "[bad-input]") {
  auto c = valid_case();
  auto expect = [&](continuum::ForwardArgs<double> a, const char* name) {
    INFO("expecting an error naming " << name);
    CHECK_THROWS_MATCHES(continuum::attention_forward(continuum::cpu, a), std::invalid_argument, Names(name));
  };
  auto a0 = c.forward_args();
  { auto a = a0; a.key.dim = 4; expect(a, "key"); }                       // D mismatch
  { auto a = a0; a.value.seq = 5; expect(a, "key and value: seq_len (Lk) must match, got key 6, value 5"); }
  { auto a = a0; a.key.seq = 5; expect(a, "key and value: seq_len (Lk) must match, got key 5, value 6"); }
  { auto a = a0; a.key.heads = 3; a.value.heads = 3; expect(a, "key"); }  // Hq % Hk != 0
  { auto a = a0; a.key.batch = 1; expect(a, "key"); }                     // batch mismatch
  { auto a = a0; a.out.dim = 3; expect(a, "out"); }                       // Dv mismatch
  { auto a = a0; a.out.seq = 4; expect(a, "out"); }
  { auto a = a0; a.query.stride_dim = 2; expect(a, "query"); }            // dim not contiguous
  { auto a = a0; a.key.stride_seq = -3; expect(a, "key"); }               // negative stride
  { auto a = a0; a.value.data = nullptr; expect(a, "value"); }            // null data
  { auto a = a0; a.out.stride_seq = 0; expect(a, "out"); }                // output overlaps itself
  { auto a = a0; a.key.stride_seq = std::numeric_limits<index_t>::max() / 2; expect(a, "key"); }  // offset overflow
  { auto a = a0; a.out.stride_head = std::numeric_limits<index_t>::max() / 3; expect(a, "out"); }  // (UB, then OOB access, before)
  { auto a = a0; a.out.data = const_cast<double*>(a.query.data); expect(a, "out"); }  // aliasing
  { auto a = a0; a.query.dim = -1; a.key.dim = -1; expect(a, "query"); }  // negative size
  { auto a = a0; a.temperature.value = 0; expect(a, "temperature"); }
  { auto a = a0; a.temperature.value = -2; expect(a, "temperature"); }
  { auto a = a0; a.temperature.value = std::nan(""); expect(a, "temperature"); }
  { auto a = a0; a.temperature.value = INFINITY; expect(a, "temperature"); }
  { auto a = a0; a.temperature.shape = TemperatureShape::per_head; a.temperature.data = nullptr; expect(a, "temperature"); }
  std::vector<double> heads = {1, 1, -1, 1};
  { auto a = a0; a.temperature.shape = TemperatureShape::per_head; a.temperature.data = heads.data(); expect(a, "temperature"); }
  { auto a = a0; a.scale = 0.0; expect(a, "scale"); }
  { auto a = a0; a.scale = std::nan(""); expect(a, "scale"); }
  std::vector<index_t> lo(10, 0), hi(10, 6), bad_hi(10, 7), inv_lo(10, 4), inv_hi(10, 2);
  { auto a = a0; a.visibility.range_lo = lo.data(); expect(a, "range"); }  // only one of the pair
  { auto a = a0; a.visibility.range_lo = lo.data(); a.visibility.range_hi = bad_hi.data(); expect(a, "range"); }
  { auto a = a0; a.visibility.range_lo = inv_lo.data(); a.visibility.range_hi = inv_hi.data(); expect(a, "range"); }
  { auto a = a0; a.num_threads = -1; expect(a, "num_threads"); }
  { auto a = a0; a.kernel = static_cast<continuum::Kernel>(7); expect(a, "kernel"); }
}

TEST_CASE("bad input: backward arguments", "[bad-input]") {
  auto c = valid_case();
  c.forward();
  auto expect = [&](continuum::BackwardArgs<double> a, const char* name) {
    INFO("expecting an error naming " << name);
    CHECK_THROWS_MATCHES(continuum::attention_backward(continuum::cpu, a), std::invalid_argument, Names(name));
  };
  auto a0 = c.backward_args();
  { auto a = a0; a.grad_out.seq = 4; expect(a, "grad_out"); }
  { auto a = a0; a.out.dim = 3; expect(a, "out"); }
  { auto a = a0; a.grad_query.dim = 2; expect(a, "grad_query"); }
  { auto a = a0; a.grad_key.seq = 5; expect(a, "grad_key"); }
  { auto a = a0; a.grad_value.heads = 4; expect(a, "grad_value"); }
  { auto a = a0; a.grad_query.data = a.grad_key.data; expect(a, "grad"); }  // outputs alias
  { auto a = a0; a.key.dim = 4; expect(a, "key"); }
  { auto a = a0; a.temperature.value = 0; expect(a, "temperature"); }
  { auto a = a0; a.scale = -1.0; expect(a, "scale"); }
  { auto a = a0; a.num_threads = -3; expect(a, "num_threads"); }
}

TEMPLATE_TEST_CASE("bad input: non-finite Q/K/V reach only the rows that see them", "[bad-input][non-finite]",
                   float, double) {
  use_mp_precision();
  // Lq = Lk = 10, causal, window 2: key j is seen by rows j and j + 1.
  const TestType bad = GENERATE(std::numeric_limits<TestType>::quiet_NaN(),
                                std::numeric_limits<TestType>::infinity());
  const int where = GENERATE(0, 1, 2);  // 0: K row 5, 1: V row 5, 2: Q row 5
  Case<TestType> c;
  c.Lq = c.Lk = 10;
  c.D = 3;
  c.Dv = 2;
  c.vis.causal = true;
  c.vis.window_left = 1;
  c.alloc();
  auto rng = rng_for(41);
  c.fill_uniform(rng);
  if (where == 0) c.k.at(0, 0, 5, 1) = bad;
  if (where == 1) c.v.at(0, 0, 5, 0) = bad;
  if (where == 2) c.q.at(0, 0, 5, 2) = bad;
  c.forward();
  c.backward();
  // clean copy for the reference of the clean rows
  Case<TestType> clean = c;
  if (where == 0) clean.k.at(0, 0, 5, 1) = TestType(0.25);
  if (where == 1) clean.v.at(0, 0, 5, 0) = TestType(0.25);
  if (where == 2) clean.q.at(0, 0, 5, 2) = TestType(0.25);
  const auto p = clean.template problem<mp>();
  const auto f = continuum::reference::forward(p);
  const auto g = continuum::reference::backward(p, clean.template grad_out_ref<mp>());
  auto dirty_row = [&](index_t i) { return where == 2 ? i == 5 : (i == 5 || i == 6); };
  const double tol = forward_tolerance<TestType>(2, 3), btol = backward_tolerance<TestType>(2, 3);
  for (index_t i = 0; i < 10; ++i) {
    INFO("bad " << bad << " where " << where << " row " << i);
    bool finite = true;
    for (index_t d = 0; d < 2; ++d) finite = finite && std::isfinite(c.o.at(0, 0, i, d));
    if (dirty_row(i)) {
      // A NaN anywhere, or an inf in V, must show in the rows that see it. An
      // inf in Q or K makes scores ±inf: a -inf score is a legitimate zero
      // weight, so those rows' values are not specified.
      if (std::isnan(bad) || where == 1) CHECK_FALSE(finite);
      continue;
    }
    CHECK(finite);
    for (index_t d = 0; d < 2; ++d)
      CHECK(std::fabs(double(c.o.at(0, 0, i, d)) - f.out[static_cast<std::size_t>(i * 2 + d)].toDouble()) <= tol);
    CHECK(std::fabs(double(c.lse[static_cast<std::size_t>(i)]) - f.lse[static_cast<std::size_t>(i)].toDouble()) <= tol * 4);
    for (index_t d = 0; d < 3; ++d)
      CHECK(std::fabs(double(c.dq.at(0, 0, i, d)) - g.grad_query[static_cast<std::size_t>(i * 3 + d)].toDouble()) <= btol * 4);
  }
  // keys seen only by clean rows: K/V rows 0–3 (rows ≤ 4) and 7–9 (rows ≥ 7)
  for (index_t j : {0, 1, 2, 3, 7, 8, 9}) {
    INFO("bad " << bad << " where " << where << " key " << j);
    for (index_t d = 0; d < 3; ++d)
      CHECK(std::fabs(double(c.dk.at(0, 0, j, d)) - g.grad_key[static_cast<std::size_t>(j * 3 + d)].toDouble()) <= btol * 4);
    for (index_t d = 0; d < 2; ++d)
      CHECK(std::fabs(double(c.dv.at(0, 0, j, d)) - g.grad_value[static_cast<std::size_t>(j * 2 + d)].toDouble()) <= btol * 4);
  }
}

// ---------------------------------------------------------------------------
// Hostile inputs (issue 12): aliasing at element level, total size checks,
// zero sizes, scale / τ in the precision the kernel folds it in.

TEST_CASE("hostile input: an output sharing memory with the temperature, ranges or lse is rejected", "[bad-input][hostile]") {
  auto c = valid_case();
  c.tshape = TemperatureShape::per_query;
  c.alloc();
  auto rng = rng_for(32);
  c.fill_uniform(rng);
  std::vector<double> tau(128, 0.5);       // the first `rows` are the temperature
  std::vector<double> ranges(128, 0.0);  // storage for [B, Lq] index_t ranges and a view over them
  auto* lo = reinterpret_cast<index_t*>(ranges.data());
  for (index_t k = 0; k < c.B * c.Lq; ++k) lo[k] = 0, lo[16 + k] = c.Lk;
  auto expect = [&](continuum::ForwardArgs<double> a, const char* name) {
    INFO("expecting an error naming " << name);
    CHECK_THROWS_MATCHES(continuum::attention_forward(continuum::cpu, a), std::invalid_argument, Names(name));
  };
  auto a0 = c.forward_args();
  a0.temperature.data = tau.data();
  { auto a = a0; a.out.data = tau.data() + 3; expect(a, "temperature.data"); }  // was accepted
  { auto a = a0; a.lse = tau.data() + 7; expect(a, "temperature.data"); }
  {
    auto a = a0;
    a.visibility.range_lo = lo;
    a.visibility.range_hi = lo + 16;
    a.out = continuum::TensorView<double>::bhsd(ranges.data() + 20, c.B, c.Hq, c.Lq, c.Dv);  // over range_hi
    expect(a, "visibility.range_hi");
  }
  { auto a = a0; a.lse = c.o.view.data; expect(a, "lse: shares memory with the output out"); }
  // Backward: dτ over the temperature, dV over lse.
  c.forward();
  auto b0 = c.backward_args();
  b0.temperature.data = tau.data();
  std::vector<double> lse_and_more(64, 0.0);  // lse in [0, 40)
  std::copy(c.lse.begin(), c.lse.end(), lse_and_more.begin());
  b0.lse = lse_and_more.data();
  {
    auto b = b0;
    b.grad_temperature = tau.data();
    CHECK_THROWS_MATCHES(continuum::attention_backward(continuum::cpu, b), std::invalid_argument,
                         Names("grad_temperature: shares memory with the input temperature.data"));
  }
  {
    auto b = b0;
    b.grad_value = continuum::TensorView<double>::bhsd(lse_and_more.data() + 16, c.B, c.Hk, c.Lk, c.Dv);
    CHECK_THROWS_MATCHES(continuum::attention_backward(continuum::cpu, b), std::invalid_argument,
                         Names("grad_value: shares memory with the input lse"));
  }
  {  // a self-overlapping gradient view: the message names that view
    auto b = b0;
    b.grad_key.stride_head = 1;
    CHECK_THROWS_MATCHES(continuum::attention_backward(continuum::cpu, b), std::invalid_argument,
                         Names("grad_key: output view overlaps itself"));
  }
}

TEST_CASE("hostile input: packed layouts that share no element are accepted (dQ, dK, dV of one buffer)", "[bad-input][hostile]") {
  // Q, K, V and dQ, dK, dV as views of packed [B, L, 3, H, D] buffers, the
  // layout of a fused QKV projection and of its gradient: interleaved spans,
  // no shared element. The results equal those with separate buffers.
  const index_t B = 2, H = 2, L = 5, D = 3;
  auto c = valid_case();
  c.Hq = c.Hk = H, c.Lq = c.Lk = L, c.D = D, c.Dv = D;
  c.alloc();
  auto rng = rng_for(33);
  c.fill_uniform(rng);
  c.forward();
  c.backward();
  std::vector<double> qkv(static_cast<std::size_t>(B * L * 3 * H * D)), grad(qkv.size(), -7.0);
  auto packed = [&](auto* base, int which) {
    using V = std::remove_pointer_t<decltype(base)>;
    return continuum::TensorView<V>{base + which * H * D, B, H, L, D, L * 3 * H * D, D, 3 * H * D, 1};
  };
  for (int w = 0; w < 3; ++w) {
    const auto& src = w == 0 ? c.q : w == 1 ? c.k : c.v;
    const auto dst = packed(qkv.data(), w);
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t s = 0; s < L; ++s)
          for (index_t d = 0; d < D; ++d) dst.row(b, h, s)[d] = src.at(b, h, s, d);
  }
  auto a = c.backward_args();
  a.query = packed(static_cast<const double*>(qkv.data()), 0);
  a.key = packed(static_cast<const double*>(qkv.data()), 1);
  a.value = packed(static_cast<const double*>(qkv.data()), 2);
  a.grad_query = packed(grad.data(), 0);
  a.grad_key = packed(grad.data(), 1);
  a.grad_value = packed(grad.data(), 2);
  std::vector<double> dtau(1);
  a.grad_temperature = dtau.data();
  REQUIRE_NOTHROW(continuum::attention_backward(continuum::cpu, a));  // was: "grad_key: aliases grad_query"
  for (int w = 0; w < 3; ++w) {
    const auto& want = w == 0 ? c.dq : w == 1 ? c.dk : c.dv;
    const auto got = packed(grad.data(), w);
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t s = 0; s < L; ++s)
          for (index_t d = 0; d < D; ++d) CHECK(got.row(b, h, s)[d] == want.at(b, h, s, d));
  }
  CHECK(dtau[0] == c.dtau[0]);
  // The packed output of the forward likewise: out inside qkv's gaps is fine
  // only where it shares no element; here it does.
  auto f = c.forward_args();
  f.query = a.query, f.key = a.key, f.value = a.value;
  f.out = packed(qkv.data(), 1);
  CHECK_THROWS_MATCHES(continuum::attention_forward(continuum::cpu, f), std::invalid_argument,
                       Names("out: shares memory with the input"));
}

TEST_CASE("hostile input: size products that overflow are rejected, never wrapped", "[bad-input][hostile]") {
  // Lq = Lk = 2^32 with D = Dv = 0: every view is empty, but P is
  // [1, 1, 2^32, 2^32] = 2^64 elements (was: wrapped to 0, accepted, and
  // the kernel wrote P far past its buffer).
  const index_t big = index_t(1) << 32;
  std::vector<double> tiny(4);
  continuum::ForwardArgs<double> a;
  a.query = {nullptr, 1, 1, big, 0, 0, 0, 0, 1};
  a.key = {nullptr, 1, 1, big, 0, 0, 0, 0, 1};
  a.value = a.key;
  a.out = {nullptr, 1, 1, big, 0, 0, 0, 0, 1};
  a.scale = 1.0;
  a.probs = tiny.data();
  CHECK_THROWS_MATCHES(continuum::attention_forward(continuum::cpu, a), std::invalid_argument,
                       Names("probs / cell_mass: [B, Hq, Lq, Lk]"));
  // [2^62, 36, 0, 4]: no element, but 2^62·36 overflows (signed overflow
  // before the 0 was multiplied in; UBSan reported it). An empty problem.
  const index_t huge = index_t(1) << 62;
  continuum::ForwardArgs<double> e;
  e.query = {nullptr, huge, 36, 0, 4, 0, 0, 0, 1};
  e.key = {nullptr, huge, 36, 0, 4, 0, 0, 0, 1};
  e.value = e.key;
  e.out = {nullptr, huge, 36, 0, 4, 0, 0, 0, 1};
  CHECK_NOTHROW(continuum::attention_forward(continuum::cpu, e));
  // More than 2^62 elements in a view, or offsets beyond 2^62.
  e.key.seq = e.value.seq = 2;
  CHECK_THROWS_MATCHES(continuum::attention_forward(continuum::cpu, e), std::invalid_argument,
                       Names("key: shape [4611686018427387904, 36, 2, 4] has more than 2^62 elements"));
  auto c = valid_case();
  auto f = c.forward_args();
  f.key.stride_batch = huge;  // (B - 1)·2^62 + ... > 2^62
  f.key.stride_head = 1;
  CHECK_THROWS_MATCHES(continuum::attention_forward(continuum::cpu, f), std::invalid_argument,
                       Names("key: shape [2, 2, 6, 3] with strides"));
}

TEST_CASE("hostile input: zero sizes work (empty outputs, zero gradients) and never reach a kernel", "[bad-input][hostile]") {
  for (const bool tiled : {false, true}) {
    INFO("float_arithmetic " << tiled);
    // Hq = Hk = 0 (was: accepted, then SIGFPE in the tiled backward) and
    // Hq = 0 with Hk = 2: nothing is attended; dK, dV, dτ are zero.
    for (const index_t hk : {0, 2}) {
      Case<double> c;
      c.B = 2, c.Hq = 0, c.Hk = hk, c.Lq = 3, c.Lk = 4, c.D = 2, c.Dv = 3;
      c.alloc();
      auto rng = rng_for(34);
      c.fill_uniform(rng);
      auto f = c.forward_args();
      f.compute = tiled ? continuum::Compute::automatic : continuum::Compute::float64;
      CHECK_NOTHROW(continuum::attention_forward(continuum::cpu, f));
      auto b = c.backward_args();
      b.compute = tiled ? continuum::Compute::automatic : continuum::Compute::float64;
      c.dtau[0] = 7.0;
      CHECK_NOTHROW(continuum::attention_backward(continuum::cpu, b));
      CHECK(c.dtau[0] == 0.0);
      c.dk.for_each([](double x) { CHECK(x == 0.0); });
      c.dv.for_each([](double x) { CHECK(x == 0.0); });
    }
    // D = 0 with an explicit scale and null Q, K: every score is 0, so P is
    // uniform and o the mean of the visible values (MATH.md §7.2).
    Case<double> c;
    c.Lq = c.Lk = 3, c.D = 0, c.Dv = 2;
    c.scale = 1.0;
    c.alloc();
    auto rng = rng_for(35);
    c.fill_uniform(rng);
    auto f = c.forward_args();
    f.query.data = nullptr, f.key.data = nullptr;
    f.compute = tiled ? continuum::Compute::automatic : continuum::Compute::float64;
    REQUIRE_NOTHROW(continuum::attention_forward(continuum::cpu, f));
    for (index_t d = 0; d < 2; ++d)
      CHECK_THAT(c.o.at(0, 0, 1, d), Catch::Matchers::WithinRel((c.v.at(0, 0, 0, d) + c.v.at(0, 0, 1, d) + c.v.at(0, 0, 2, d)) / 3, 1e-15));
    // Lk = 0 with huge strides on the empty key view: empty rows (o = 0,
    // lse = -inf); no offset is formed from them.
    Case<double> e;
    e.B = 2, e.Lq = 2, e.Lk = 0, e.D = 2;
    e.alloc();
    auto g = e.forward_args();
    g.key.stride_batch = g.value.stride_batch = index_t(1) << 61;
    g.compute = tiled ? continuum::Compute::automatic : continuum::Compute::float64;
    REQUIRE_NOTHROW(continuum::attention_forward(continuum::cpu, g));
    e.o.for_each([](double x) { CHECK(x == 0.0); });
    for (double l : e.lse) CHECK(l == -INFINITY);
  }
}

TEST_CASE("hostile input: scale / temperature beyond float is computed in double, not dropped", "[bad-input][hostile]") {
  // float storage, τ = 1e-39 (subnormal), scale 0.5: c = 5e38 is finite in
  // double but overflows float, in which the float kernels fold it (was:
  // accepted, o = 0 and lse = -inf). Such rows are computed in double
  // (backends/cpu.hpp): the same bits as Compute::float64 gives them.
  Case<float> c;
  c.Lq = c.Lk = 4, c.D = 4;
  c.tau = 1e-39f;
  c.alloc();
  auto rng = rng_for(36);
  c.fill_uniform(rng);
  for (double scale : {0.5, 1e39}) {  // 1e39: beyond FLT_MAX itself (τ = 1)
    INFO("scale " << scale);
    if (scale > 1) c.tau = 1.0f;
    auto a = c.forward_args();
    a.scale = scale;
    a.compute = continuum::Compute::float64;
    REQUIRE_NOTHROW(continuum::attention_forward(continuum::cpu, a));
    const std::vector<float> o64(c.o.buf.begin(), c.o.buf.end());
    a.compute = continuum::Compute::automatic;
    c.o.buf.assign(c.o.buf.size(), -1.0f);
    REQUIRE_NOTHROW(continuum::attention_forward(continuum::cpu, a));
    for (std::size_t i = 0; i < o64.size(); ++i) {
      CHECK(std::isfinite(c.o.buf[i]));
      CHECK(c.o.buf[i] == o64[i]);
    }
    auto b = c.backward_args();
    b.scale = scale;
    b.compute = continuum::Compute::float64;
    REQUIRE_NOTHROW(continuum::attention_backward(continuum::cpu, b));
    const std::vector<float> dq64(c.dq.buf.begin(), c.dq.buf.end()), dk64(c.dk.buf.begin(), c.dk.buf.end());
    b.compute = continuum::Compute::automatic;
    REQUIRE_NOTHROW(continuum::attention_backward(continuum::cpu, b));
    for (std::size_t i = 0; i < dq64.size(); ++i) CHECK(c.dq.buf[i] == dq64[i]);
    for (std::size_t i = 0; i < dk64.size(); ++i) CHECK(c.dk.buf[i] == dk64[i]);
  }
}

TEST_CASE("hostile input: the element-level aliasing test agrees with brute force", "[bad-input][hostile]") {
  // Random small views at random offsets of one buffer: share_memory must say
  // whether some element of one is an element of the other, exactly.
  std::mt19937_64 rng(37);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  static double buffer[4096];
  auto random_view = [&](bool output) {
    while (true) {
      continuum::TensorView<double> v{buffer + pick(0, 200), pick(1, 3), pick(1, 3), pick(1, 4), pick(1, 4),
                                      pick(0, 60), pick(0, 20), pick(0, 10), 1};
      if (!output) return v;
      try {  // outputs: only layouts check_view accepts
        continuum::detail::check_view("t", "v", v, v.batch, v.heads, v.seq, v.dim, "", true);
        return v;
      } catch (const std::invalid_argument&) {
      }
    }
  };
  auto elements = [](const continuum::TensorView<double>& v) {
    std::set<const double*> e;
    for (index_t b = 0; b < v.batch; ++b)
      for (index_t h = 0; h < v.heads; ++h)
        for (index_t s = 0; s < v.seq; ++s)
          for (index_t d = 0; d < v.dim; ++d) e.insert(v.row(b, h, s) + d);
    return e;
  };
  int shared = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const auto w = random_view(true), x = random_view(trial % 2 == 0);
    const auto ew = elements(w), ex = elements(x);
    bool brute = false;
    for (const double* p : ex) brute = brute || ew.count(p) != 0;
    shared += brute;
    const auto rw = continuum::detail::region_of("w", w), rx = continuum::detail::region_of("x", x);
    INFO("trial " << trial);
    REQUIRE(continuum::detail::share_memory(rw, rx) == brute);
  }
  CHECK(shared > 300);  // both answers are exercised
  CHECK(shared < 2700);
}

TEMPLATE_TEST_CASE("non-finite data: every output it reaches is NaN, every other output keeps its bits",
                   "[bad-input][non-finite]", float, double) {
  // Lq = Lk = 40, causal with window (4, 0), GQA 2:1, per-query τ: key j is
  // seen by rows j … j + 4 of both query heads. A NaN or an Inf goes into
  // key 17, value 17, query 17 (head 1) or dO 17 (head 0); the rows that see
  // it must give NaN in out, lse, P, π, dQ and dτ, and NaN in dK and dV of
  // every key they see; every other element must equal the clean run's bits.
  const TestType bad = GENERATE(std::numeric_limits<TestType>::quiet_NaN(),
                                std::numeric_limits<TestType>::infinity());
  const int where = GENERATE(0, 1, 2, 3);  // K, V, Q, dO
  const auto compute = GENERATE(continuum::Compute::automatic, continuum::Compute::float64);
  if (std::is_same<TestType, double>::value && compute == continuum::Compute::float64) return;
  Case<TestType> c;
  c.Hq = 2;
  c.Hk = 1;
  c.Lq = c.Lk = 40;
  c.D = 5;
  c.Dv = 3;
  c.vis.causal = true;
  c.vis.window_left = 4;
  c.tshape = TemperatureShape::per_query;
  c.compute = compute;
  c.want_maps = true;
  c.alloc();
  auto rng = rng_for(4242);
  c.fill_uniform(rng);
  Case<TestType> clean = c;
  clean.forward();
  clean.backward();
  if (where == 0) c.k.at(0, 0, 17, 2) = bad;
  if (where == 1) c.v.at(0, 0, 17, 1) = bad;
  if (where == 2) c.q.at(0, 1, 17, 0) = bad;
  if (where == 3) c.dout.at(0, 0, 17, 2) = bad;
  c.forward();
  c.backward();
  // Rows (h, i) that see the bad element, for the forward and the backward.
  auto sees = [&](index_t h, index_t i, bool backward) {
    if (where == 2) return h == 1 && i == 17;
    if (where == 3) return backward && h == 0 && i == 17;
    return i >= 17 && i <= 21;
  };
  auto keys_of_dirty = [&](index_t j) {  // keys some dirty backward row sees
    for (index_t h = 0; h < 2; ++h)
      for (index_t i = 0; i < 40; ++i)
        if (sees(h, i, true) && j >= i - 4 && j <= i) return true;
    return false;
  };
  const std::size_t Lk = 40;
  for (index_t h = 0; h < 2; ++h)
    for (index_t i = 0; i < 40; ++i) {
      INFO("where " << where << " bad " << bad << " head " << h << " row " << i);
      const std::size_t row = std::size_t(h * 40 + i);
      auto same = [](TestType x, TestType y) { return std::memcmp(&x, &y, sizeof x) == 0; };
      const bool fwd = sees(h, i, false), bwd = sees(h, i, true);
      for (index_t d = 0; d < 3; ++d)
        CHECK((fwd ? std::isnan(c.o.at(0, h, i, d)) : same(c.o.at(0, h, i, d), clean.o.at(0, h, i, d))));
      CHECK((fwd ? std::isnan(c.lse[row]) : same(c.lse[row], clean.lse[row])));
      for (std::size_t j = 0; j < Lk; ++j) {
        CHECK((fwd ? std::isnan(c.probs[row * Lk + j]) : same(c.probs[row * Lk + j], clean.probs[row * Lk + j])));
        CHECK((fwd ? std::isnan(c.cell[row * Lk + j]) : same(c.cell[row * Lk + j], clean.cell[row * Lk + j])));
      }
      for (index_t d = 0; d < 5; ++d)
        CHECK((bwd ? std::isnan(c.dq.at(0, h, i, d)) : same(c.dq.at(0, h, i, d), clean.dq.at(0, h, i, d))));
      CHECK((bwd ? std::isnan(c.dtau[row]) : same(c.dtau[row], clean.dtau[row])));
    }
  for (index_t j = 0; j < 40; ++j) {
    INFO("where " << where << " bad " << bad << " key " << j);
    const bool dirty = keys_of_dirty(j);
    for (index_t d = 0; d < 5; ++d)
      CHECK((dirty ? std::isnan(c.dk.at(0, 0, j, d))
                   : std::memcmp(&c.dk.at(0, 0, j, d), &clean.dk.at(0, 0, j, d), sizeof(TestType)) == 0));
    for (index_t d = 0; d < 3; ++d)
      CHECK((dirty ? std::isnan(c.dv.at(0, 0, j, d))
                   : std::memcmp(&c.dv.at(0, 0, j, d), &clean.dv.at(0, 0, j, d), sizeof(TestType)) == 0));
  }
}
