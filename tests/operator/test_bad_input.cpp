// Invalid arguments (issue 2 item 6): every kind throws std::invalid_argument
// whose message names the argument; non-finite values in Q/K/V reach only the
// rows that see them.
#include <catch2/catch.hpp>

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
  { auto a = a0; a.value.seq = 5; expect(a, "value"); }                   // Lk mismatch
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
