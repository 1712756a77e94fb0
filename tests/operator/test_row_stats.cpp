// The forward's row statistics handed to the backward (params.hpp RowStats;
// MATH.md §6, "row statistics from the forward"): the backward computes the
// same statistics itself when it is given none, with the same forward kernel,
// so its gradients must be the same bits either way — for float and double
// storage (bfloat16: test_storage16.cpp), both kernels, full, causal and windowed rows with GQA, and
// Compute::float64 (whose forward leaves no statistics: every ref −1). Also:
// what the forward leaves (every visible row has a reference key inside its
// range), and the errors for statistics that cannot be a call's.
#include <catch2/catch.hpp>

#include <cstring>

#include "operator/harness.hpp"

using namespace harness;
using continuum::index_t;

namespace {

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
Case<T> make_case(continuum::Kernel kernel, int shape) {
  Case<T> c;
  c.kernel = kernel;
  c.B = 2;
  c.Hq = 4;
  c.Hk = shape == 2 ? 2 : 4;
  c.Lq = shape == 1 ? 70 : 600;
  c.Lk = 600;
  c.D = 16;
  c.Dv = 12;
  c.tau = T(0.3);
  c.threads = 2;
  if (shape == 1) c.vis.causal = true;
  if (shape == 2) {
    c.vis.window_left = 40;
    c.vis.window_right = 3;
  }
  c.alloc();
  auto rng = rng_for(std::uint64_t(4100 + 10 * shape + int(kernel)));
  c.fill_uniform(rng);
  return c;
}

}  // namespace

TEMPLATE_TEST_CASE("backward: the forward's row statistics change no bit of the gradients", "[operator][tiled]", float,
                   double) {
  using A = continuum::accum_t<TestType>;
  const auto kernel = GENERATE(continuum::Kernel::continuum, continuum::Kernel::softmax);
  const int shape = GENERATE(0, 1, 2);
  const bool wide = GENERATE(false, true);  // Compute::float64
  if (wide && std::is_same<TestType, double>::value) return;
  INFO("kernel " << int(kernel) << ", shape " << shape << (wide ? ", float64" : ""));
  Case<TestType> c = make_case<TestType>(kernel, shape);
  if (wide) c.compute = continuum::Compute::float64;
  const index_t rows = c.B * c.Hq * c.Lq;
  std::vector<A> values(std::size_t(rows * continuum::row_stats_width(c.dv_dim())));
  std::vector<index_t> ref(std::size_t(rows), index_t(-7));
  auto fa = c.forward_args();
  fa.row_stats = {values.data(), ref.data()};
  continuum::attention_forward(continuum::cpu, fa);
  // What the forward left: a reference key in each row's range, or none at all with float64.
  const auto p = c.template problem<long double>();
  for (index_t r = 0; r < rows; ++r) {
    const auto [lo, hi] = p.visible(r / (c.Hq * c.Lq), r % c.Lq);
    if (wide || hi <= lo)
      CHECK(ref[std::size_t(r)] == -1);
    else
      CHECK((ref[std::size_t(r)] >= lo && ref[std::size_t(r)] < hi));
  }
  c.backward();
  const auto dq = c.dq.contiguous(), dk = c.dk.contiguous(), dv = c.dv.contiguous();
  const auto dtau = c.dtau;
  auto ba = c.backward_args();
  ba.row_stats = continuum::RowStats<const A>{values.data(), ref.data()};
  continuum::attention_backward(continuum::cpu, ba);
  CHECK(same_bits(dq, c.dq.contiguous()));
  CHECK(same_bits(dk, c.dk.contiguous()));
  CHECK(same_bits(dv, c.dv.contiguous()));
  CHECK(same_bits(dtau, c.dtau));
}

TEST_CASE("backward: row statistics that cannot be the call's are rejected", "[operator][errors]") {
  Case<float> c = make_case<float>(continuum::Kernel::continuum, 2);  // window (40, 3)
  const index_t rows = c.B * c.Hq * c.Lq;
  std::vector<float> values(std::size_t(rows * continuum::row_stats_width(c.dv_dim())));
  std::vector<index_t> ref(std::size_t(rows), index_t(0));
  auto fa = c.forward_args();
  fa.row_stats = {values.data(), ref.data()};
  continuum::attention_forward(continuum::cpu, fa);
  auto ba = c.backward_args();
  ba.row_stats = continuum::RowStats<const float>{values.data(), ref.data()};
  SECTION("statistics of another window") {
    ba.visibility.window_left = 10;  // row i's reference key may now lie outside its keys
    CHECK_THROWS_WITH(continuum::attention_backward(continuum::cpu, ba),
                      Catch::Contains("reference key outside their row's visible keys"));
  }
  SECTION("the backward reads them") {  // (so that the bitwise test above is not vacuous)
    continuum::attention_backward(continuum::cpu, ba);
    const auto dq = c.dq.contiguous();
    for (std::size_t r = 0; r < ref.size(); ++r) values[r * std::size_t(continuum::row_stats_width(c.dv_dim())) + 5] += 1;
    continuum::attention_backward(continuum::cpu, ba);
    CHECK(dq != c.dq.contiguous());
  }
  SECTION("values without ref") {
    ba.row_stats.ref = nullptr;
    CHECK_THROWS_WITH(continuum::attention_backward(continuum::cpu, ba), Catch::Contains("row_stats: values and ref"));
  }
  SECTION("statistics written over an input") {
    fa.row_stats.values = reinterpret_cast<float*>(c.q.view.data);
    CHECK_THROWS_WITH(continuum::attention_forward(continuum::cpu, fa), Catch::Contains("row_stats.values"));
  }
}
