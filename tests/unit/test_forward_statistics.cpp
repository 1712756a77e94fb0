// The row statistics the tiled forward leaves for its backward
// (backends/cpu/tiled.hpp, RowStatistics; MATH.md §6) against the long double
// reference forward (attention/reference.hpp) of the same rounded inputs:
// the reference key (the first key at the row maximum), the near keys'
// weights, and the far keys' Σ α̃ and Σ α̃ (v − v_ref), each divided by the
// kernel's own Z̃ and compared with the reference's P.
//
// The keys hold planted maxima at the tile edges (keys 0, 510–513, 1023,
// 1024 and the last: the near keys then straddle two key tiles of 512, and the
// reference key or its left neighbour is a tile's held-back last key) and the
// other rows are random, so their maximum moves from tile to tile; full,
// causal and windowed rows, one of them sharp (τ = 0.01).
//
// Tolerance: a P_j computed from scores that are each within Δ of exact has a
// relative error of at most about 2Δ plus the stencil's few ulp (MATH.md §10),
// Δ ≤ D·ε·c·Σ_d |q_d k_jd| for a dot product in T; the bound below is 4 times
// that, and per value column it is taken against Σ_far P_j (|v_j| + |v_ref|)
// (the far sums' own magnitude, which cancellation cannot shrink).
#include <catch2/catch.hpp>

#include <continuum/attention/reference.hpp>
#include <continuum/backends/cpu/tiled.hpp>

#include <cmath>
#include <random>
#include <vector>

namespace {

using continuum::index_t;

template <class T, class Stencil>
void check_statistics(const continuum::Visibility& vis, continuum::Kernel kernel) {
  namespace tiled = continuum::cpu_detail::tiled;
  namespace ref = continuum::reference;
  using R = long double;
  constexpr index_t Hq = 2, Lq = 24, Lk = 1100, D = 8, Dv = 5;
  std::mt19937 gen(20261205);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> q(Hq * Lq * D), k(Lk * D), v(Lk * Dv), out(Hq * Lq * Dv), taus(Hq * Lq, T(0.5));
  for (auto& x : q) x = T(0.3 * normal(gen));
  for (auto& x : k) x = T(normal(gen));
  for (auto& x : v) x = T(normal(gen));
  // Planted maxima: key spike[s] points along dimension s, and query row s of
  // each head along it too.
  const index_t spike[] = {0, 510, 511, 512, 513, 1023, 1024, Lk - 1};
  for (index_t s = 0; s < 8; ++s) {
    for (index_t d = 0; d < D; ++d) k[spike[s] * D + d] = T(0.1 * normal(gen));
    k[spike[s] * D + s] = T(6);
    for (index_t h = 0; h < Hq; ++h) q[(h * Lq + s) * D + s] = T(3);
  }
  taus[Lq - 1] = T(0.01);  // one sharp row

  continuum::ForwardArgs<T> a;
  a.kernel = kernel;
  a.scale = 0.5;
  a.visibility = vis;
  a.temperature = {continuum::TemperatureShape::per_query, T(1), taus.data()};
  a.query = continuum::TensorView<const T>::bhsd(q.data(), 1, Hq, Lq, D);
  a.key = continuum::TensorView<const T>::bhsd(k.data(), 1, 1, Lk, D);
  a.value = continuum::TensorView<const T>::bhsd(v.data(), 1, 1, Lk, Dv);
  a.out = continuum::TensorView<T>::bhsd(out.data(), 1, Hq, Lq, Dv);

  const index_t rows = Hq * Lq;
  const index_t width = continuum::row_stats_width(Dv);
  std::vector<T> values(rows * width);
  std::vector<index_t> refs(rows, -2);
  tiled::RowStatistics<T> stats{values.data(), refs.data(), width};
  const auto m = [&](index_t row) { return values[row * width]; };
  const auto near = [&](index_t row, index_t k) { return values[row * width + 1 + k]; };
  const auto far_sum = [&](index_t row) { return values[row * width + 4]; };
  const auto far_diff = [&](index_t row, index_t d) { return values[row * width + 5 + d]; };
  tiled::forward_tiled<T, Stencil>(a, 0.5, nullptr, [](const std::vector<index_t>&) { FAIL("a row was declined"); },
                                   continuum::cpu_detail::bf16::Unit::none,
                                   continuum::cpu_detail::StencilAccuracy::full, stats);

  const auto p = ref::from_args<R>(a);
  const index_t nearest = kernel == continuum::Kernel::continuum ? 1 : 0;
  const R eps = R(std::numeric_limits<T>::epsilon());
  index_t checked = 0, at_edges = 0;
  for (index_t h = 0; h < Hq; ++h)
    for (index_t i = 0; i < Lq; ++i) {
      const index_t row = h * Lq + i;
      const auto r = ref::forward_row(p, 0, h, i);
      INFO("head " << h << ", query " << i << ", keys [" << r.lo << ", " << r.hi << ")");
      if (r.hi <= r.lo) {
        CHECK(refs[row] == -2);  // an empty row leaves no statistics
        continue;
      }
      index_t want_ref = r.lo;
      for (index_t j = r.lo; j < r.hi; ++j)
        if (r.score[j - r.lo] > r.score[want_ref - r.lo]) want_ref = j;
      REQUIRE(refs[row] == want_ref);
      ++checked;
      for (index_t s : spike) at_edges += want_ref == s && s != 0 && s != Lk - 1;
      // Δ: the scores' error bound; tol: the relative bound on each P_j.
      R delta = 0;
      for (index_t j = r.lo; j < r.hi; ++j) {
        R dot = 0;
        for (index_t d = 0; d < D; ++d) dot += std::fabs(p.query[p.q_index(0, h, i) + d] * p.key[j * D + d]);
        delta = std::max(delta, R(D) * eps * std::fabs(r.c) * dot);
      }
      const R tol = 4 * (2 * delta + 8 * eps);
      const R z = R(far_sum(row)) + R(near(row, 0)) + R(near(row, 1)) + R(near(row, 2));
      // The near keys: their own P_j; nothing outside the row, nothing for softmax's neighbours.
      for (index_t n = 0; n < 3; ++n) {
        const index_t j = want_ref - 1 + n;
        const bool is_near = j >= r.lo && j < r.hi && std::abs(j - want_ref) <= nearest;
        const R want = is_near ? r.prob[j - r.lo] : R(0);
        CHECK(std::fabs(R(near(row, n)) / z - want) <= tol * want);
      }
      // The far keys.
      R want_sum = 0;
      std::vector<R> want_diff(Dv, R(0)), size(Dv, R(0));
      const R* vref = p.value.data() + p.v_index(0, 0, want_ref);
      for (index_t j = r.lo; j < r.hi; ++j) {
        if (std::abs(j - want_ref) <= nearest) continue;
        const R pj = r.prob[j - r.lo];
        want_sum += pj;
        for (index_t d = 0; d < Dv; ++d) {
          want_diff[d] += pj * (p.value[p.v_index(0, 0, j) + d] - vref[d]);
          size[d] += pj * (std::fabs(p.value[p.v_index(0, 0, j) + d]) + std::fabs(vref[d]));
        }
      }
      CHECK(std::fabs(R(far_sum(row)) / z - want_sum) <= tol * want_sum);
      for (index_t d = 0; d < Dv; ++d) CHECK(std::fabs(R(far_diff(row, d)) / z - want_diff[d]) <= tol * size[d]);
      // m is the kernel's score at ref (within Δ of the exact maximum).
      CHECK(std::fabs(R(m(row)) - r.shift) <= delta + eps * std::fabs(r.shift));
    }
  CHECK(checked > Lq);
  if (vis.window_left < 0 && !vis.causal) CHECK(at_edges >= 2 * 6);  // the planted maxima were the references
}

}  // namespace

TEMPLATE_TEST_CASE("the forward's row statistics: reference key, near and far sums", "[unit][tiled]", float,
                   double) {
  const int shape = GENERATE(0, 1, 2);
  const bool continuum_kernel = GENERATE(true, false);
  continuum::Visibility vis;
  if (shape == 1) vis.causal = true;
  if (shape == 2) {
    vis.window_left = 600;
    vis.window_right = 3;
  }
  INFO((shape == 0 ? "full" : shape == 1 ? "causal" : "window (600, 3)") << ", "
                                                                            << (continuum_kernel ? "continuum" : "softmax"));
  if (continuum_kernel)
    check_statistics<TestType, continuum::ContinuumStencil>(vis, continuum::Kernel::continuum);
  else
    check_statistics<TestType, continuum::SoftmaxStencil>(vis, continuum::Kernel::softmax);
}
