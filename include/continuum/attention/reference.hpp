// attention/reference.hpp — a plain, materialising reference implementation of
// Continuum Attention (MATH.md §3–§6), written for checking, not for speed.
//
// Everything is computed straight from the formulas of MATH.md, row by row,
// in a scalar type R chosen by the caller: `mpfr::mpreal` (≥ 200 bits) for the
// multiprecision reference of the tests, `long double` for large shapes. It
// shares no code with the operator or with math/: it has its own visibility
// logic (§3), its own exponential moments (§5) and its own backward (§6).
//
// The moments are evaluated as
//   * |a| ≤ 1: the Taylor series μ_k(a) = Σ a^m/(m!(m+k+1)) (and the matching
//     series of ν, κ, ν2, μ2), summed until a term no longer changes the sum:
//     the terms then shrink at least twofold each, so the truncation is below
//     one ulp at any precision of R; the terms alternate in sign but |a| ≤ 1
//     keeps the cancellation to a factor ≤ e, i.e. < 2 bits;
//   * |a| > 1: the closed forms of MATH.md §5. Their cancellation is largest at
//     |a| = 1 (κ: 1 - 3/e ≈ 0.10 against terms ≈ 1, ~4 bits), so the result
//     keeps ≥ precision - 5 bits: ≥ 195 bits in mpreal(200), ≥ 59 in long double.
// No threshold tuning is needed because the working precision absorbs the
// cancellation; that is the point of a reference. The reference itself is
// checked against direct quadrature of the curve (MATH.md §7.8) by
// tests/reference/test_reference_quadrature.cpp.
//
// Precision needed. The forward is accurate to a few ulp of R. The backward
// forms dα_ij = (dP_ij - Dl_i)/Z_i as written in MATH.md §6; at the row maximum
// this cancels to O(τ) when τ → 0 while dS_ij ~ τ², so dS carries an absolute
// error ~ ε_R·|dO||v|: use ε_R ≪ τ² (e.g. 640 bits at τ = 1e-38; 256 bits
// suffice for τ ≳ 1e-30 to ~17 digits).
//
// R must provide +, -, *, /, comparisons, and exp, expm1, log, sqrt found by
// ADL or in std (mpfr::mpreal and the built-in floating types do). This
// header does not include mpreal.h.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "params.hpp"

namespace continuum {
namespace reference {

// ---------------------------------------------------------------------------
// §5 exponential moments, for a ≤ 0 (also valid for a > 0 where noted).

namespace moments {

/// Σ_m a^m/m! / den(m), for |a| ≤ 1 and positive integers den(m) that do not
/// decrease: summed until a term no longer changes the sum (at most 400 terms).
/// From there each term is at most half the one before (|a|/(m+1) ≤ 1/2), so
/// the terms left out add up to less than one ulp of the sum, at any precision of R.
template <class R, class Den>
R taylor(const R& a, Den den) {
  R term = R(1);  // a^m / m!
  R sum = term / den(0);
  for (long m = 1; m < 400; ++m) {
    term *= a;
    term /= m;
    const R next = sum + term / den(m);
    if (next == sum) break;
    sum = next;
  }
  return sum;
}

template <class R>
bool small(const R& a) {
  return -R(1) <= a && a <= R(1);
}

/// μ0(a) = ∫_0^1 e^{au} du = expm1(a)/a. Any real a.
template <class R>
R mu0(const R& a) {
  using std::expm1;
  if (small(a)) return taylor(a, [](long m) { return m + 1; });
  return expm1(a) / a;
}
/// μ1(a) = ∫_0^1 u e^{au} du = (a e^a - expm1(a))/a².
template <class R>
R mu1(const R& a) {
  using std::exp;
  using std::expm1;
  if (small(a)) return taylor(a, [](long m) { return m + 2; });
  return ((a * exp(a) - expm1(a)) / a) / a;
}
/// μ2(a) = ∫_0^1 u² e^{au} du = (e^a (a² - 2a + 2) - 2)/a³.
template <class R>
R mu2(const R& a) {
  using std::exp;
  if (small(a)) return taylor(a, [](long m) { return m + 3; });
  return (((exp(a) * ((a - R(2)) * a + R(2)) - R(2)) / a) / a) / a;
}
/// ν(a) = ∫_0^1 (1-u) e^{au} du = (expm1(a) - a)/a².
template <class R>
R nu(const R& a) {
  using std::expm1;
  if (small(a)) return taylor(a, [](long m) { return (m + 1) * (m + 2); });
  return ((expm1(a) - a) / a) / a;
}
/// κ(a) = ∫_0^1 u(1-u) e^{au} du = ((a-2) e^a + a + 2)/a³.
template <class R>
R kappa(const R& a) {
  using std::exp;
  if (small(a)) return taylor(a, [](long m) { return (m + 2) * (m + 3); });
  return ((((a - R(2)) * exp(a) + a + R(2)) / a) / a) / a;
}
/// ν2(a) = ∫_0^1 (1-u)² e^{au} du = (a² + 2a + 2 - 2 e^a)/(-a³).
template <class R>
R nu2(const R& a) {
  using std::exp;
  if (small(a)) return R(2) * taylor(a, [](long m) { return (m + 1) * (m + 2) * (m + 3); });
  return -((((a + R(2)) * a + R(2) - R(2) * exp(a)) / a) / a) / a;
}

}  // namespace moments

// ---------------------------------------------------------------------------
// §4–§5 segment quantities (x: score at the knot we look at, y: the other).

/// w(x, y) = ∫_0^1 (1-u) e^{(1-u)x + uy} du = e^m ν(-δ) (x ≥ y) or e^m μ1(-δ).
template <class R>
R segment_weight(const R& x, const R& y) {
  using std::exp;
  const R m = x < y ? y : x;
  const R a = x < y ? x - y : y - x;  // -|x - y|
  return exp(m) * (x < y ? moments::mu1(a) : moments::nu(a));
}
/// ∂w/∂x(x, y) = ∫_0^1 (1-u)² e^{...} du = e^m ν2(-δ) (x ≥ y) or e^m μ2(-δ).
template <class R>
R segment_weight_dx(const R& x, const R& y) {
  using std::exp;
  const R m = x < y ? y : x;
  const R a = x < y ? x - y : y - x;
  return exp(m) * (x < y ? moments::mu2(a) : moments::nu2(a));
}
/// ∂w/∂y(x, y) = ∫_0^1 u(1-u) e^{...} du = e^m κ(-δ).
template <class R>
R segment_weight_dy(const R& x, const R& y) {
  using std::exp;
  const R m = x < y ? y : x;
  const R a = x < y ? x - y : y - x;
  return exp(m) * moments::kappa(a);
}
/// ∫_0^{1/2} e^{(1-u)x + uy} du: the half of segment (x, y) next to x (§5).
template <class R>
R half_segment_mass(const R& x, const R& y) {
  using std::exp;
  const R m = x < y ? y : x;
  const R h = (x < y ? x - y : y - x) / R(2);  // -δ/2
  const R near = moments::mu0(h) / R(2);
  return exp(m) * (x < y ? exp(h) * near : near);
}

// ---------------------------------------------------------------------------
// The problem, in R, BHSD contiguous.

/// One attention problem with every input held in R. Layouts (contiguous):
/// query [B, Hq, Lq, D], key [B, Hk, Lk, D], value [B, Hk, Lk, Dv],
/// temperature [1] / [Hq] / [B, Hq, Lq], range_lo/hi empty or [B, Lq].
/// Not validated: forward() and backward() assume what attention_forward
/// checks (validate.hpp; e.g. Hk > 0 dividing Hq, τ > 0, ranges inside
/// [0, Lk]); from_args() of an operator call that passed validation gives
/// such a problem.
template <class R>
struct Problem {
  index_t batch = 1, heads_q = 1, heads_kv = 1, len_q = 0, len_k = 0, dim = 0, dim_v = 0;
  std::vector<R> query, key, value;
  TemperatureShape temperature_shape = TemperatureShape::scalar;
  std::vector<R> temperature{R(1)};
  R scale = R(1);
  bool causal = false;
  index_t window_left = -1, window_right = -1;  ///< negative = unlimited
  std::vector<index_t> range_lo, range_hi;
  Kernel kernel = Kernel::continuum;

  std::size_t q_index(index_t b, index_t h, index_t i) const {
    return static_cast<std::size_t>(((b * heads_q + h) * len_q + i) * dim);
  }
  std::size_t k_index(index_t b, index_t g, index_t j) const {
    return static_cast<std::size_t>(((b * heads_kv + g) * len_k + j) * dim);
  }
  std::size_t v_index(index_t b, index_t g, index_t j) const {
    return static_cast<std::size_t>(((b * heads_kv + g) * len_k + j) * dim_v);
  }
  std::size_t row_index(index_t b, index_t h, index_t i) const {
    return static_cast<std::size_t>((b * heads_q + h) * len_q + i);
  }
  /// Index into `temperature` for query (b, h, i).
  std::size_t temperature_index(index_t b, index_t h, index_t i) const {
    switch (temperature_shape) {
      case TemperatureShape::scalar: return 0;
      case TemperatureShape::per_head: return static_cast<std::size_t>(h);
      default: return row_index(b, h, i);
    }
  }
  index_t kv_head(index_t h) const { return h / (heads_q / heads_kv); }

  /// MATH.md §3, written out independently: [lo, hi) of query i in batch b.
  /// Full: [0, Lk). Causal (bottom-right): hi = min(Lk, i + Lk - Lq + 1).
  /// Window (left, right) around the diagonal key d = i + Lk - Lq:
  /// d - left ≤ j ≤ d + right, a negative bound unlimited. Explicit ranges
  /// are intersected. Bounds are compared in long double, so huge ones
  /// cannot overflow here either.
  /// Returns lo ≥ hi for an empty row (normalised to lo = hi).
  std::pair<index_t, index_t> visible(index_t b, index_t i) const {
    index_t lo = 0, hi = len_k;
    if (causal) {
      const index_t c = i + len_k - len_q + 1;
      if (c < hi) hi = c;
    }
    const long double d = static_cast<long double>(i) + len_k - len_q;
    if (window_left >= 0 && d - window_left > lo) lo = static_cast<index_t>(d - window_left);
    if (window_right >= 0 && d + window_right + 1 < hi) hi = static_cast<index_t>(d + window_right + 1);
    if (!range_lo.empty()) {
      const index_t rl = range_lo[static_cast<std::size_t>(b * len_q + i)];
      const index_t rh = range_hi[static_cast<std::size_t>(b * len_q + i)];
      if (rl > lo) lo = rl;
      if (rh < hi) hi = rh;
    }
    if (lo < 0) lo = 0;
    if (hi > len_k) hi = len_k;
    if (hi < lo) hi = lo;
    return {lo, hi};
  }
};

/// The forward of one row (MATH.md §4). Vectors over j are indexed j - lo.
template <class R>
struct Row {
  index_t lo = 0, hi = 0;
  R c = R(0);                     ///< score scale c = scale / τ_i
  std::vector<R> score;           ///< s_ij (unshifted)
  R shift = R(0);                 ///< row maximum M
  std::vector<R> alpha;           ///< α_ij e^{-M}
  R z = R(0);                     ///< Σ α e^{-M}
  std::vector<R> prob;            ///< P_ij
  std::vector<R> cell;            ///< π_ij
  std::vector<R> out;             ///< o_i (Dv)
  R lse = R(0);                   ///< log Z_i, -inf if empty
};

template <class R>
Row<R> forward_row(const Problem<R>& p, index_t b, index_t h, index_t i) {
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
  r.c = p.scale / p.temperature[p.temperature_index(b, h, i)];
  const R* q = p.query.data() + p.q_index(b, h, i);
  r.score.resize(static_cast<std::size_t>(n));
  for (index_t j = 0; j < n; ++j) {
    const R* k = p.key.data() + p.k_index(b, g, r.lo + j);
    R dot = R(0);
    for (index_t d = 0; d < p.dim; ++d) dot += q[d] * k[d];
    r.score[static_cast<std::size_t>(j)] = r.c * dot;
  }
  r.shift = r.score[0];
  for (const R& s : r.score)
    if (r.shift < s) r.shift = s;
  std::vector<R> x(r.score.size());
  for (std::size_t j = 0; j < x.size(); ++j) x[j] = r.score[j] - r.shift;

  r.alpha.resize(x.size());
  r.cell.resize(x.size());
  for (index_t j = 0; j < n; ++j) {
    const std::size_t u = static_cast<std::size_t>(j);
    if (p.kernel == Kernel::continuum) {
      const R left = j > 0 ? segment_weight(x[u], x[u - 1]) : exp(x[u]) / R(2);
      const R right = j + 1 < n ? segment_weight(x[u], x[u + 1]) : exp(x[u]) / R(2);
      r.alpha[u] = left + right;
      const R cl = j > 0 ? half_segment_mass(x[u], x[u - 1]) : exp(x[u]) / R(2);
      const R cr = j + 1 < n ? half_segment_mass(x[u], x[u + 1]) : exp(x[u]) / R(2);
      r.cell[u] = cl + cr;
    } else {
      r.alpha[u] = exp(x[u]);
      r.cell[u] = r.alpha[u];
    }
  }
  R zc = R(0);
  for (std::size_t j = 0; j < x.size(); ++j) {
    r.z += r.alpha[j];
    zc += r.cell[j];
  }
  r.prob.resize(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) {
    r.prob[j] = r.alpha[j] / r.z;
    r.cell[j] = r.cell[j] / zc;
  }
  for (index_t j = 0; j < n; ++j) {
    const R* v = p.value.data() + p.v_index(b, g, r.lo + j);
    for (index_t d = 0; d < p.dim_v; ++d)
      r.out[static_cast<std::size_t>(d)] += r.prob[static_cast<std::size_t>(j)] * v[d];
  }
  r.lse = r.shift + log(r.z);
  return r;
}

/// Full forward: out [B,Hq,Lq,Dv], lse [B,Hq,Lq] (natural log; −∞ for an
/// empty row), probs and cell [B,Hq,Lq,Lk] (zeros outside the visible range),
/// scores [B,Hq,Lq,Lk].
template <class R>
struct ForwardResult {
  std::vector<R> out, lse, probs, cell, scores;
};

template <class R>
ForwardResult<R> forward(const Problem<R>& p) {
  ForwardResult<R> f;
  const std::size_t rows = static_cast<std::size_t>(p.batch * p.heads_q * p.len_q);
  f.out.assign(rows * static_cast<std::size_t>(p.dim_v), R(0));
  f.lse.assign(rows, R(0));
  f.probs.assign(rows * static_cast<std::size_t>(p.len_k), R(0));
  f.cell.assign(rows * static_cast<std::size_t>(p.len_k), R(0));
  f.scores.assign(rows * static_cast<std::size_t>(p.len_k), R(0));
  for (index_t b = 0; b < p.batch; ++b)
    for (index_t h = 0; h < p.heads_q; ++h)
      for (index_t i = 0; i < p.len_q; ++i) {
        const Row<R> r = forward_row(p, b, h, i);
        const std::size_t ri = p.row_index(b, h, i);
        f.lse[ri] = r.lse;
        for (index_t d = 0; d < p.dim_v; ++d)
          f.out[ri * static_cast<std::size_t>(p.dim_v) + static_cast<std::size_t>(d)] =
              r.out[static_cast<std::size_t>(d)];
        for (index_t j = r.lo; j < r.hi; ++j) {
          const std::size_t u = static_cast<std::size_t>(j - r.lo);
          const std::size_t at = ri * static_cast<std::size_t>(p.len_k) + static_cast<std::size_t>(j);
          f.probs[at] = r.prob[u];
          f.cell[at] = r.cell[u];
          f.scores[at] = r.score[u];
        }
      }
  return f;
}

/// Backward of one row (MATH.md §6): dS_ij over the visible range (indexed
/// j - lo) of query (b, h) with forward row r; `dout` points at dO_i (Dv values).
template <class R>
std::vector<R> grad_scores(const Problem<R>& p, const Row<R>& r, const R* dout, index_t b, index_t h) {
  using std::exp;
  const index_t n = r.hi - r.lo;
  std::vector<R> ds(static_cast<std::size_t>(n > 0 ? n : 0), R(0));
  if (n <= 0) return ds;
  const index_t g = p.kv_head(h);
  R dl = R(0);
  for (index_t d = 0; d < p.dim_v; ++d) dl += dout[d] * r.out[static_cast<std::size_t>(d)];
  std::vector<R> dalpha(ds.size()), x(ds.size());
  for (index_t j = 0; j < n; ++j) {
    const std::size_t u = static_cast<std::size_t>(j);
    const R* v = p.value.data() + p.v_index(b, g, r.lo + j);
    R dp = R(0);
    for (index_t d = 0; d < p.dim_v; ++d) dp += dout[d] * v[d];
    dalpha[u] = (dp - dl) / r.z;
    x[u] = r.score[u] - r.shift;
  }
  for (index_t j = 0; j < n; ++j) {
    const std::size_t u = static_cast<std::size_t>(j);
    if (p.kernel != Kernel::continuum) {
      ds[u] = dalpha[u] * exp(x[u]);
      continue;
    }
    // ∂α_j/∂s_j: ∂w/∂x on each side, or e^{s}/2 for a flat half-cell.
    const R dl_side = j > 0 ? segment_weight_dx(x[u], x[u - 1]) : exp(x[u]) / R(2);
    const R dr_side = j + 1 < n ? segment_weight_dx(x[u], x[u + 1]) : exp(x[u]) / R(2);
    R acc = dalpha[u] * (dl_side + dr_side);
    // ∂α_{j-1}/∂s_j = ∂w/∂y(s_{j-1}, s_j), ∂α_{j+1}/∂s_j = ∂w/∂y(s_{j+1}, s_j).
    if (j > 0) acc += dalpha[u - 1] * segment_weight_dy(x[u - 1], x[u]);
    if (j + 1 < n) acc += dalpha[u + 1] * segment_weight_dy(x[u + 1], x[u]);
    ds[u] = acc;
  }
  return ds;
}

/// Full backward. grad_out [B,Hq,Lq,Dv] contiguous. Results: grad_query
/// [B,Hq,Lq,D], grad_key [B,Hk,Lk,D], grad_value [B,Hk,Lk,Dv], grad_temperature
/// in the temperature's shape, grad_scores [B,Hq,Lq,Lk] (dS, zeros outside).
template <class R>
struct BackwardResult {
  std::vector<R> grad_query, grad_key, grad_value, grad_temperature, grad_scores;
};

template <class R>
BackwardResult<R> backward(const Problem<R>& p, const std::vector<R>& grad_out) {
  BackwardResult<R> g;
  g.grad_query.assign(p.query.size(), R(0));
  g.grad_key.assign(p.key.size(), R(0));
  g.grad_value.assign(p.value.size(), R(0));
  g.grad_temperature.assign(p.temperature.size(), R(0));
  g.grad_scores.assign(static_cast<std::size_t>(p.batch * p.heads_q * p.len_q * p.len_k), R(0));
  for (index_t b = 0; b < p.batch; ++b)
    for (index_t h = 0; h < p.heads_q; ++h)
      for (index_t i = 0; i < p.len_q; ++i) {
        const Row<R> r = forward_row(p, b, h, i);
        const index_t n = r.hi - r.lo;
        if (n <= 0) continue;
        const std::size_t ri = p.row_index(b, h, i);
        const R* dout = grad_out.data() + ri * static_cast<std::size_t>(p.dim_v);  // (data() + 0 when Dv = 0)
        const std::vector<R> ds = grad_scores(p, r, dout, b, h);
        const index_t kvh = p.kv_head(h);
        const std::size_t ti = p.temperature_index(b, h, i);
        const R tau = p.temperature[ti];
        R* dq = g.grad_query.data() + p.q_index(b, h, i);
        const R* q = p.query.data() + p.q_index(b, h, i);
        R dtau = R(0);
        for (index_t j = 0; j < n; ++j) {
          const std::size_t u = static_cast<std::size_t>(j);
          g.grad_scores[ri * static_cast<std::size_t>(p.len_k) + static_cast<std::size_t>(r.lo + j)] =
              ds[u];
          const R* k = p.key.data() + p.k_index(b, kvh, r.lo + j);
          R* dk = g.grad_key.data() + p.k_index(b, kvh, r.lo + j);
          R* dv = g.grad_value.data() + p.v_index(b, kvh, r.lo + j);
          for (index_t d = 0; d < p.dim; ++d) {
            dq[d] += r.c * ds[u] * k[d];
            dk[d] += r.c * ds[u] * q[d];
          }
          for (index_t d = 0; d < p.dim_v; ++d) dv[d] += r.prob[u] * dout[d];
          dtau += ds[u] * r.score[u];
        }
        g.grad_temperature[ti] -= dtau / tau;
      }
  return g;
}

// ---------------------------------------------------------------------------
// Reading the operator's arguments (strided views) into a Problem<R>.

/// Exact conversion of a float/double input to R.
template <class R, class T>
R exact(T x) {
  return R(static_cast<long double>(x));
}

template <class R, class T>
std::vector<R> gather(const TensorView<const T>& t) {
  std::vector<R> out;
  out.reserve(static_cast<std::size_t>(t.batch * t.heads * t.seq * t.dim));
  for (index_t b = 0; b < t.batch; ++b)
    for (index_t h = 0; h < t.heads; ++h)
      for (index_t s = 0; s < t.seq; ++s) {
        const T* r = t.row(b, h, s);
        for (index_t d = 0; d < t.dim; ++d) out.push_back(exact<R>(r[d]));
      }
  return out;
}

/// The same problem as the operator call `a` describes, every input converted
/// exactly to R (the reference is fed the operator's rounded inputs). The
/// default scale 1/sqrt(D) is computed in R.
template <class R, class T>
Problem<R> from_args(const ForwardArgs<T>& a) {
  using std::sqrt;
  Problem<R> p;
  p.batch = a.query.batch;
  p.heads_q = a.query.heads;
  p.heads_kv = a.key.heads;
  p.len_q = a.query.seq;
  p.len_k = a.key.seq;
  p.dim = a.query.dim;
  p.dim_v = a.value.dim;
  p.query = gather<R>(a.query);
  p.key = gather<R>(a.key);
  p.value = gather<R>(a.value);
  p.temperature_shape = a.temperature.shape;
  switch (a.temperature.shape) {
    case TemperatureShape::scalar: p.temperature = {exact<R>(a.temperature.value)}; break;
    case TemperatureShape::per_head:
      p.temperature.clear();
      for (index_t h = 0; h < p.heads_q; ++h) p.temperature.push_back(exact<R>(a.temperature.data[h]));
      break;
    default:
      p.temperature.clear();
      for (index_t t = 0; t < p.batch * p.heads_q * p.len_q; ++t)
        p.temperature.push_back(exact<R>(a.temperature.data[t]));
  }
  p.scale = a.scale ? exact<R>(*a.scale) : R(1) / sqrt(R(p.dim));
  p.causal = a.visibility.causal;
  p.window_left = a.visibility.window_left;
  p.window_right = a.visibility.window_right;
  if (a.visibility.range_lo) {
    p.range_lo.assign(a.visibility.range_lo, a.visibility.range_lo + p.batch * p.len_q);
    p.range_hi.assign(a.visibility.range_hi, a.visibility.range_hi + p.batch * p.len_q);
  }
  p.kernel = a.kernel;
  return p;
}

}  // namespace reference
}  // namespace continuum
