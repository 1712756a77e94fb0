// tests/reference/quadrature.hpp — direct numerical integration of the memory
// curve of MATH.md §2/§4, independent of the closed forms (MATH.md §7.8).
//
// For query i the score along the curve is s(t), piecewise linear between the
// knots s_ij with flat half-token cells at both ends of [lo - 1/2, hi - 1/2].
// We integrate e^{s(t) - M} by composite Gauss–Legendre (`panels` panels of
// `points` nodes on every half-token piece), accumulating
//   Z = ∫ e^{s(t)} dt,  o = ∫ e^{s} v(t) dt / Z,
//   P_j = ∫ e^{s} φ_j(t) dt / Z  (φ_j: the coefficient of v_j in v(t): the hat
//         (1-u) / u on the two segments around j, 1 on a flat end cell),
//   π_j = ∫_{cell j} e^{s} dt / Z.
// On one panel of width h the integrand is e^{linear}·(polynomial of degree
// ≤ 1) with exponent slope ≤ |Δs|, so the n-point rule's error is about
// (h|Δs|/2)^{2n}/(2n)!: with h = 1/(2·panels) this is far below 1e-40 for the
// slopes the tests use (|Δs| ≤ 40, panels = 4, points = 24).
#pragma once

#include <cmath>
#include <vector>

#include <continuum/attention/reference.hpp>

namespace continuum {
namespace quadrature {

/// n-point Gauss–Legendre rule on [0, 1], computed in R by Newton's method on
/// the Legendre polynomial (three-term recurrence).
template <class R>
struct GaussLegendre {
  std::vector<R> node, weight;
  explicit GaussLegendre(int n) {
    using std::abs;
    using std::cos;
    const R pi = R(4) * atan_one();
    for (int k = 1; k <= n; ++k) {
      R x = cos(pi * (R(k) - R(0.25)) / (R(n) + R(0.5)));
      R dp = R(0);
      for (int it = 0; it < 100; ++it) {
        R p0 = R(1), p1 = x;
        for (int m = 2; m <= n; ++m) {
          const R p2 = ((R(2 * m - 1)) * x * p1 - R(m - 1) * p0) / R(m);
          p0 = p1;
          p1 = p2;
        }
        dp = R(n) * (x * p1 - p0) / (x * x - R(1));
        const R dx = p1 / dp;
        x -= dx;
        if (abs(dx) <= abs(x) * tiny()) break;
      }
      node.push_back((R(1) - x) / R(2));
      weight.push_back(R(1) / ((R(1) - x * x) * dp * dp));  // 2/((1-x²)P'²) halved for [0,1]
    }
  }
  static R atan_one() {
    using std::atan;
    return atan(R(1));
  }
  static R tiny() { return std::numeric_limits<R>::epsilon() / R(16); }
};

template <class R>
struct Row {
  index_t lo = 0, hi = 0;
  R z = R(0);  ///< ∫ e^{s(t) - M} dt
  R lse = R(0);
  std::vector<R> out, prob, cell;
};

/// Integrates query (b, h, i) of problem p over its curve.
template <class R>
Row<R> integrate_row(const reference::Problem<R>& p, index_t b, index_t h, index_t i,
                     const GaussLegendre<R>& rule, int panels) {
  using std::exp;
  using std::log;
  Row<R> r;
  std::tie(r.lo, r.hi) = p.visible(b, i);
  const index_t n = r.hi - r.lo;
  r.out.assign(static_cast<std::size_t>(p.dim_v), R(0));
  if (n <= 0) {
    r.lse = -std::numeric_limits<R>::infinity();
    return r;
  }
  const index_t g = p.kv_head(h);
  const R c = p.scale / p.temperature[p.temperature_index(b, h, i)];
  std::vector<R> s(static_cast<std::size_t>(n));
  for (index_t j = 0; j < n; ++j) {
    R dot = R(0);
    for (index_t d = 0; d < p.dim; ++d)
      dot += p.query[p.q_index(b, h, i) + static_cast<std::size_t>(d)] *
             p.key[p.k_index(b, g, r.lo + j) + static_cast<std::size_t>(d)];
    s[static_cast<std::size_t>(j)] = c * dot;
  }
  R m = s[0];
  for (const R& x : s)
    if (m < x) m = x;
  auto v = [&](index_t j, index_t d) {
    return p.value[p.v_index(b, g, r.lo + j) + static_cast<std::size_t>(d)];
  };
  r.prob.assign(static_cast<std::size_t>(n), R(0));
  r.cell.assign(static_cast<std::size_t>(n), R(0));
  // One half-token piece: t runs over u ∈ [u0, u1] of the segment from knot a
  // to knot bb (a == bb for a flat end cell); the piece belongs to cell `owner`.
  auto piece = [&](index_t a, index_t bb, R u0, R u1, index_t owner) {
    const R width = (u1 - u0) / R(panels);
    for (int pn = 0; pn < panels; ++pn) {
      const R base = u0 + width * R(pn);
      for (std::size_t k = 0; k < rule.node.size(); ++k) {
        const R u = base + width * rule.node[k];
        const R wq = width * rule.weight[k];
        const R su = (R(1) - u) * s[static_cast<std::size_t>(a)] + u * s[static_cast<std::size_t>(bb)];
        const R e = exp(su - m) * wq;
        r.z += e;
        r.cell[static_cast<std::size_t>(owner)] += e;
        if (a == bb) {
          r.prob[static_cast<std::size_t>(a)] += e;
        } else {
          r.prob[static_cast<std::size_t>(a)] += e * (R(1) - u);
          r.prob[static_cast<std::size_t>(bb)] += e * u;
        }
        for (index_t d = 0; d < p.dim_v; ++d)
          r.out[static_cast<std::size_t>(d)] += e * ((R(1) - u) * v(a, d) + u * v(bb, d));
      }
    }
  };
  const R half = R(1) / R(2);
  for (index_t j = 0; j < n; ++j) {
    // left half of cell j: [j - 1/2, j]
    if (j == 0) piece(j, j, R(0), half, j);
    else piece(j - 1, j, half, R(1), j);
    // right half of cell j: [j, j + 1/2]
    if (j + 1 == n) piece(j, j, R(0), half, j);
    else piece(j, j + 1, R(0), half, j);
  }
  for (auto& x : r.out) x /= r.z;
  for (auto& x : r.prob) x /= r.z;
  for (auto& x : r.cell) x /= r.z;
  r.lse = m + log(r.z);
  return r;
}

}  // namespace quadrature
}  // namespace continuum
