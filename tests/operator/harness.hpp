// tests/operator/harness.hpp — shared helpers for the operator, property and
// bug-case tests: owning strided tensors, one attention "case" that builds the
// operator's arguments, runs it, and builds the reference problem from the very
// same (rounded) inputs; error measures; a record of the max errors seen.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <mpreal.h>

#include <continuum/continuum.hpp>
#include <continuum/attention/reference.hpp>

namespace harness {

using continuum::index_t;
using mp = mpfr::mpreal;

/// 256-bit MPFR for every mpreal created after this (≥ 200 bits, brief).
inline void use_mp_precision() { mp::set_default_prec(256); }

/// "(left,right)" of a visibility's window, for INFO lines.
inline std::string window_name(const continuum::Visibility& v) {
  return "(" + std::to_string(v.window_left) + "," + std::to_string(v.window_right) + ")";
}

template <class T>
constexpr double eps() {
  return static_cast<double>(std::numeric_limits<T>::epsilon());
}
template <class T>
const char* type_name() {
  return sizeof(T) == sizeof(float) ? "float" : "double";
}

/// An owning [B, H, S, D] tensor, BHSD or BSHD, with `pad` extra elements at
/// the end of every row (stride_seq = D + pad for BHSD); padding holds NaN.
template <class T>
struct Tensor {
  std::vector<T> buf;
  continuum::TensorView<T> view{};
  Tensor() = default;
  Tensor(index_t b, index_t h, index_t s, index_t d, bool bshd = false, index_t pad = 0) {
    const index_t row = d + pad;
    // exact size (so AddressSanitizer sees any overrun); capacity ≥ 1 keeps
    // data() non-null for empty tensors.
    buf.reserve(static_cast<std::size_t>(std::max<index_t>(1, b * h * s * row)));
    buf.assign(static_cast<std::size_t>(b * h * s * row), std::numeric_limits<T>::quiet_NaN());
    view.data = buf.data();
    view.batch = b;
    view.heads = h;
    view.seq = s;
    view.dim = d;
    if (bshd) {
      view.stride_seq = h * row;
      view.stride_head = row;
      view.stride_batch = s * h * row;
    } else {
      view.stride_seq = row;
      view.stride_head = s * row;
      view.stride_batch = h * s * row;
    }
  }
  Tensor(const Tensor& o) : buf(o.buf), view(o.view) { view.data = buf.data(); }
  Tensor& operator=(const Tensor& o) {
    buf = o.buf;
    view = o.view;
    view.data = buf.data();
    return *this;
  }
  Tensor(Tensor&& o) noexcept : buf(std::move(o.buf)), view(o.view) { view.data = buf.data(); }
  Tensor& operator=(Tensor&& o) noexcept {
    buf = std::move(o.buf);
    view = o.view;
    view.data = buf.data();
    return *this;
  }
  T& at(index_t b, index_t h, index_t s, index_t d) { return view.row(b, h, s)[d]; }
  T at(index_t b, index_t h, index_t s, index_t d) const { return view.row(b, h, s)[d]; }
  continuum::TensorView<const T> cview() const { return view; }
  /// Set every logical element to 0 (padding keeps its NaN).
  void zero() {
    for_each([](T& x) { x = T(0); });
  }
  template <class F>
  void for_each(F f) {
    for (index_t b = 0; b < view.batch; ++b)
      for (index_t h = 0; h < view.heads; ++h)
        for (index_t s = 0; s < view.seq; ++s)
          for (index_t d = 0; d < view.dim; ++d) f(at(b, h, s, d));
  }
  /// True when every padding element is still NaN.
  bool padding_untouched() const {
    std::vector<char> logical(buf.size(), 0);
    for (index_t b = 0; b < view.batch; ++b)
      for (index_t h = 0; h < view.heads; ++h)
        for (index_t s = 0; s < view.seq; ++s)
          for (index_t d = 0; d < view.dim; ++d)
            logical[static_cast<std::size_t>(view.row(b, h, s) + d - buf.data())] = 1;
    for (std::size_t i = 0; i < buf.size(); ++i)
      if (!logical[i] && !std::isnan(buf[i])) return false;
    return true;
  }
  /// Logical elements in BHSD order.
  std::vector<T> contiguous() const {
    std::vector<T> out;
    for (index_t b = 0; b < view.batch; ++b)
      for (index_t h = 0; h < view.heads; ++h)
        for (index_t s = 0; s < view.seq; ++s)
          for (index_t d = 0; d < view.dim; ++d) out.push_back(at(b, h, s, d));
    return out;
  }
};

/// One operator call: its inputs, outputs and the matching reference problem.
template <class T>
struct Case {
  index_t B = 1, Hq = 1, Hk = 1, Lq = 4, Lk = 4, D = 4, Dv = -1;
  bool bshd = false;
  index_t pad = 0;
  continuum::Kernel kernel = continuum::Kernel::continuum;
  continuum::Visibility vis{};
  std::vector<index_t> range_lo, range_hi;  // [B, Lq] or empty
  continuum::TemperatureShape tshape = continuum::TemperatureShape::scalar;
  T tau = T(1);
  std::vector<T> taus;  // [Hq] or [B, Hq, Lq]
  std::optional<double> scale{};
  int threads = 0;
  bool want_maps = false;  // request probs and cell_mass
  continuum::Compute compute = continuum::Compute::automatic;

  Tensor<T> q, k, v, o, dout, dq, dk, dv;
  std::vector<T> lse, probs, cell, dtau;

  index_t dv_dim() const { return Dv < 0 ? D : Dv; }

  /// Allocates every tensor (outputs NaN-filled) after the sizes are set.
  void alloc() {
    q = Tensor<T>(B, Hq, Lq, D, bshd, pad);
    k = Tensor<T>(B, Hk, Lk, D, bshd, pad);
    v = Tensor<T>(B, Hk, Lk, dv_dim(), bshd, pad);
    o = Tensor<T>(B, Hq, Lq, dv_dim(), bshd, pad);
    dout = Tensor<T>(B, Hq, Lq, dv_dim(), bshd, pad);
    dq = Tensor<T>(B, Hq, Lq, D, bshd, pad);
    dk = Tensor<T>(B, Hk, Lk, D, bshd, pad);
    dv = Tensor<T>(B, Hk, Lk, dv_dim(), bshd, pad);
    lse.reserve(1);
    lse.assign(static_cast<std::size_t>(B * Hq * Lq), std::numeric_limits<T>::quiet_NaN());
    if (want_maps) {
      probs.reserve(1);
      cell.reserve(1);
      probs.assign(static_cast<std::size_t>(B * Hq * Lq * Lk), std::numeric_limits<T>::quiet_NaN());
      cell.assign(probs.size(), std::numeric_limits<T>::quiet_NaN());
    }
    if (tshape == continuum::TemperatureShape::per_head && taus.size() != std::size_t(Hq))
      taus.assign(static_cast<std::size_t>(Hq), tau);
    if (tshape == continuum::TemperatureShape::per_query && taus.size() != std::size_t(B * Hq * Lq))
      taus.assign(static_cast<std::size_t>(B * Hq * Lq), tau);
    dtau.assign(tshape == continuum::TemperatureShape::scalar ? 1 : taus.size(),
                std::numeric_limits<T>::quiet_NaN());
  }

  template <class Rng>
  void fill_uniform(Rng& rng, double lo = -1, double hi = 1) {
    std::uniform_real_distribution<double> u(lo, hi);
    auto f = [&](T& x) { x = static_cast<T>(u(rng)); };
    q.for_each(f);
    k.for_each(f);
    v.for_each(f);
    dout.for_each(f);
  }

  continuum::Temperature<T> temperature() const {
    continuum::Temperature<T> t;
    t.shape = tshape;
    t.value = tau;
    t.data = taus.empty() ? nullptr : taus.data();
    return t;
  }
  continuum::Visibility visibility() const {
    continuum::Visibility vv = vis;
    if (!range_lo.empty()) {
      vv.range_lo = range_lo.data();
      vv.range_hi = range_hi.data();
    }
    return vv;
  }

  continuum::ForwardArgs<T> forward_args() {
    continuum::ForwardArgs<T> a;
    a.query = q.cview();
    a.key = k.cview();
    a.value = v.cview();
    a.out = o.view;
    a.lse = lse.data();
    a.kernel = kernel;
    a.temperature = temperature();
    a.scale = scale;
    a.visibility = visibility();
    a.probs = want_maps ? probs.data() : nullptr;
    a.cell_mass = want_maps ? cell.data() : nullptr;
    a.compute = compute;
    a.num_threads = threads;
    return a;
  }
  continuum::BackwardArgs<T> backward_args() {
    continuum::BackwardArgs<T> a;
    a.query = q.cview();
    a.key = k.cview();
    a.value = v.cview();
    a.out = o.cview();
    a.grad_out = dout.cview();
    a.lse = lse.data();
    a.grad_query = dq.view;
    a.grad_key = dk.view;
    a.grad_value = dv.view;
    a.grad_temperature = dtau.data();
    a.kernel = kernel;
    a.temperature = temperature();
    a.scale = scale;
    a.visibility = visibility();
    a.compute = compute;
    a.num_threads = threads;
    return a;
  }
  void forward() { continuum::attention_forward(continuum::cpu, forward_args()); }
  void backward() { continuum::attention_backward(continuum::cpu, backward_args()); }

  template <class R>
  continuum::reference::Problem<R> problem() {
    return continuum::reference::from_args<R>(forward_args());
  }
  template <class R>
  std::vector<R> grad_out_ref() const {
    std::vector<R> g;
    for (T x : dout.contiguous()) g.push_back(continuum::reference::exact<R>(x));
    return g;
  }
};

// ---------------------------------------------------------------------------
// Errors.

template <class R>
long double to_ld(const R& x) {
  return static_cast<long double>(x);
}

/// max |a - b| and max |b| over two sequences (b the reference). A non-finite
/// value where the other side differs counts as an infinite error; equal
/// infinities (lse = -inf) count as 0.
struct Error {
  double max_abs = 0;   ///< max |op - ref|
  double ref_scale = 0; ///< max |ref| over finite entries
  std::size_t worst = 0;
  double rel() const { return ref_scale > 0 ? max_abs / ref_scale : max_abs; }
};

template <class T, class R>
Error compare(const std::vector<T>& op, const std::vector<R>& ref) {
  Error e;
  const std::size_t n = std::min(op.size(), ref.size());
  if (op.size() != ref.size()) e.max_abs = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < n; ++i) {
    const long double r = to_ld(ref[i]);
    const long double a = static_cast<long double>(op[i]);
    if (std::isfinite(r)) e.ref_scale = std::max(e.ref_scale, static_cast<double>(std::fabs(r)));
    double d;
    if (std::isnan(a) || std::isnan(r)) d = (std::isnan(a) && std::isnan(r)) ? 0.0 : INFINITY;
    else if (!std::isfinite(a) || !std::isfinite(r)) d = (a == r) ? 0.0 : INFINITY;
    else d = static_cast<double>(std::fabs(a - r));
    if (d > e.max_abs || (std::isinf(d) && !std::isinf(e.max_abs))) {
      e.max_abs = d;
      e.worst = i;
    }
  }
  return e;
}

/// The largest relative error seen per label, printed when the test program
/// exits (the figures of the report).
struct ErrorLog {
  std::map<std::string, double> worst;
  ~ErrorLog() {
    for (const auto& kv : worst) std::printf("[max-error] %-40s %.3e\n", kv.first.c_str(), kv.second);
  }
};
inline ErrorLog& error_log() {
  static ErrorLog log;
  return log;
}
inline void record(const std::string& label, double rel) {
  double& w = error_log().worst[label];
  if (rel > w || std::isnan(rel)) w = rel;
}

/// Max |s| over the visible scores of a reference forward (for tolerances).
template <class R>
double max_abs_score(const continuum::reference::Problem<R>& p) {
  double m = 0;
  for (index_t b = 0; b < p.batch; ++b)
    for (index_t h = 0; h < p.heads_q; ++h)
      for (index_t i = 0; i < p.len_q; ++i) {
        const auto r = continuum::reference::forward_row(p, b, h, i);
        for (const R& s : r.score) m = std::max(m, static_cast<double>(std::fabs(to_ld(s))));
      }
  return m;
}

/// Forward tolerance, relative to the output's max-abs (and absolute for lse).
///
/// Derivation. The operator rounds (a) c = scale/τ (relative ε) and (b) each
/// dot product q·k of D terms (error ≤ γ_D Σ|q_d k_d|, typically ~ε√D·|q||k|),
/// so each computed score carries |δs_j| ≲ ε (|s_j| + c|q||k|) √D ≤ 2ε√D(1 +
/// max|s|) for the inputs we draw (|q_d|,|k_d| of one size). A perturbation
/// δs moves P by at most Σ_j |∂P/∂s_j| |δs_j| ≤ 4 max|δs| (each α_j depends
/// on three scores with |∂α/∂s| ≤ α, and the normalisation doubles it), hence
/// δo ≤ 4 max|δs| · max|v|, and lse moves by ≤ max|δs|. The remaining
/// arithmetic (moments to a few ulp, sums of Lk terms with positive weights)
/// adds O(ε) relative. With max|v| ≈ max|o| for the inputs used, the bound is
///   err / max|o| ≤ C ε (1 + max|s|) √D,
/// C = 16 (4 from ∂P/∂s, 2 from the score bound, 2 for the accumulations).
/// The tolerance is the larger of this bound and the brief's fixed figures for
/// O(1) scores (1e-13 double, 2e-6 float): the fixed figures govern O(1)
/// scores, the conditioning term governs large ones (|s| ≳ 40 in double).
template <class T>
double forward_tolerance(double max_score, index_t D) {
  const double fixed = sizeof(T) == sizeof(float) ? 2e-6 : 1e-13;
  const double cond = 16.0 * eps<T>() * (1.0 + max_score) * std::sqrt(static_cast<double>(D));
  return std::max(fixed, cond);
}

inline std::mt19937_64 rng_for(std::uint64_t salt) { return std::mt19937_64(0x5eedc0ffee ^ salt); }

}  // namespace harness

namespace harness {

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b);  // below

/// Backward tolerance relative to each gradient's max-abs. Double: the brief's
/// 1e-12 for O(1) scores. Float: 2e-5: the backward chains three roundings
/// more than the forward (dP - Dl, the stencil of dS, the sums over Lk for dK,
/// dV and dτ), each amplifying the forward's ~2e-6 by ≤ 3 (dα = (dP - Dl)/Z
/// cancels when attention is peaked); 10 × the forward's figure. For larger
/// scores the conditioning term of forward_tolerance applies squared in
/// (1 + max|s|), since dτ carries an extra factor s (dτ = -Σ dS s / τ).
template <class T>
double backward_tolerance(double max_score, index_t D) {
  const double fixed = sizeof(T) == sizeof(float) ? 2e-5 : 1e-12;
  const double cond =
      64.0 * eps<T>() * (1.0 + max_score) * (1.0 + max_score) * std::sqrt(static_cast<double>(D));
  return std::max(fixed, cond);
}

template <class R>
double max_abs(const std::vector<R>& v) {
  double m = 0;
  for (const R& x : v) {
    const double d = static_cast<double>(std::fabs(to_ld(x)));
    if (std::isfinite(d)) m = std::max(m, d);
  }
  return m;
}

struct ForwardCheck {
  Error out, lse, probs, cell;
  double tol = 0, max_score = 0;
};

/// Runs the operator forward on c and compares out, lse (and P, π when
/// c.want_maps) with the reference in R fed the same inputs. Records the
/// relative errors under `label`.
template <class R, class T>
ForwardCheck check_forward(Case<T>& c, const std::string& label) {
  c.forward();
  const auto p = c.template problem<R>();
  const auto f = continuum::reference::forward(p);
  ForwardCheck r;
  r.max_score = max_abs(f.scores);
  r.tol = forward_tolerance<T>(r.max_score, c.D);
  r.out = compare(c.o.contiguous(), f.out);
  r.lse = compare(c.lse, f.lse);
  INFO("forward " << label << " " << type_name<T>() << " B=" << c.B << " Hq=" << c.Hq << " Hk=" << c.Hk
                  << " Lq=" << c.Lq << " Lk=" << c.Lk << " D=" << c.D << " Dv=" << c.dv_dim()
                  << " causal=" << c.vis.causal << " window=" << window_name(c.vis) << " max|s|=" << r.max_score
                  << " tol=" << r.tol);
  INFO("out: max abs err " << r.out.max_abs << " at " << r.out.worst << " (ref max-abs " << r.out.ref_scale
                           << "); lse: max abs err " << r.lse.max_abs << " at " << r.lse.worst);
  record("forward out " + label + " " + type_name<T>(), r.out.rel());
  record("forward lse(abs) " + label + " " + type_name<T>(), r.lse.max_abs / std::max(1.0, r.lse.ref_scale));
  CHECK(r.out.max_abs <= r.tol * std::max(r.out.ref_scale, 1e-300));
  CHECK(r.lse.max_abs <= r.tol * std::max(1.0, r.lse.ref_scale));
  CHECK(c.o.padding_untouched());
  if (c.want_maps) {
    r.probs = compare(c.probs, f.probs);
    r.cell = compare(c.cell, f.cell);
    INFO("P: max abs err " << r.probs.max_abs << " at " << r.probs.worst << "; pi: " << r.cell.max_abs
                           << " at " << r.cell.worst);
    record("forward P(abs) " + label + " " + type_name<T>(), r.probs.max_abs);
    record("forward pi(abs) " + label + " " + type_name<T>(), r.cell.max_abs);
    CHECK(r.probs.max_abs <= r.tol);
    CHECK(r.cell.max_abs <= r.tol);
  }
  // P and π come from the same kernels as out and lse (MATH.md §10,
  // "Inspection maps"): without them the call must give the same bits.
  const bool maps = c.want_maps;
  c.want_maps = false;
  if (maps) {
    const std::vector<T> o1 = c.o.contiguous(), l1 = c.lse;
    c.forward();
    INFO("out and lse with and without P/pi");
    CHECK(bitwise_equal(c.o.contiguous(), o1));
    CHECK(bitwise_equal(c.lse, l1));
  }
  if (std::is_same<T, float>::value && c.compute == continuum::Compute::automatic) {
    // Float storage with Compute::float64 (no maps: the tiled kernels in
    // double), same inputs: the double result rounded once per element, so
    // within 2^-24 of each output's size plus the double computation's bound.
    c.compute = continuum::Compute::float64;
    c.forward();
    c.compute = continuum::Compute::automatic;
    const double tol64 = std::ldexp(1.0, -24) + forward_tolerance<double>(r.max_score, c.D);
    const Error out64 = compare(c.o.contiguous(), f.out), lse64 = compare(c.lse, f.lse);
    INFO("Compute::float64: out max abs err " << out64.max_abs << " at " << out64.worst << ", lse "
                                              << lse64.max_abs << "; tol " << tol64);
    record("forward out " + label + " float/compute float64", out64.rel());
    CHECK(out64.max_abs <= tol64 * std::max(out64.ref_scale, 1e-300));
    CHECK(lse64.max_abs <= tol64 * std::max(1.0, lse64.ref_scale));
  }
  c.want_maps = maps;
  return r;
}

/// The sizes of the terms the gradients sum, from the reference's P (f.probs)
/// and dS (g.grad_scores), with c_max = scale / τ_min:
///   dq = c_max · max_i Σ_j |dS_ij| · max|k|,   dk = c_max · max_j Σ_i |dS_ij| · max|q|,
///   dv = max_j Σ_i P_ij · max|dO|,              dtau = max_i Σ_j |dS_ij s_ij| / τ_min
/// (the column sums j run over the query heads that share a KV head). A
/// gradient that cancels is held to its rounding relative to these; a
/// relative perturbation η of every P or dS term moves it by at most η times
/// them (test_storage16.cpp: the bfloat16 units' rounded P and dS).
struct GradTermScales {
  double dq = 0, dk = 0, dv = 0, dtau = 0;
};
template <class P, class F, class G>
GradTermScales grad_term_scales(const P& p, const F& f, const G& g, double max_dout = 0) {
  double tmin = 1e300;
  for (const auto& t : p.temperature) tmin = std::min(tmin, static_cast<double>(to_ld(t)));
  const double cmax = static_cast<double>(to_ld(p.scale)) / tmin, qmax = max_abs(p.query), kmax = max_abs(p.key);
  const std::size_t Lk = static_cast<std::size_t>(p.len_k);
  const std::size_t rows = g.grad_scores.size() / std::max<std::size_t>(Lk, 1);
  double row_ds = 0, row_dss = 0;
  std::vector<double> col_ds(static_cast<std::size_t>(p.batch * p.heads_kv) * Lk, 0.0), col_p(col_ds.size(), 0.0);
  for (std::size_t ri = 0; ri < rows; ++ri) {
    double a = 0, b2 = 0;
    const std::size_t bh = ri / static_cast<std::size_t>(p.len_q);
    const std::size_t bb = bh / static_cast<std::size_t>(p.heads_q), hh = bh % static_cast<std::size_t>(p.heads_q);
    const std::size_t kvrow =
        bb * static_cast<std::size_t>(p.heads_kv) + static_cast<std::size_t>(p.kv_head(static_cast<index_t>(hh)));
    for (std::size_t j = 0; j < Lk; ++j) {
      const double ds = std::fabs(static_cast<double>(to_ld(g.grad_scores[ri * Lk + j])));
      a += ds;
      b2 += ds * std::fabs(static_cast<double>(to_ld(f.scores[ri * Lk + j])));
      col_ds[kvrow * Lk + j] += ds;
      col_p[kvrow * Lk + j] += std::fabs(static_cast<double>(to_ld(f.probs[ri * Lk + j])));
    }
    row_ds = std::max(row_ds, a);
    row_dss = std::max(row_dss, b2);
  }
  GradTermScales t;
  t.dq = cmax * row_ds * kmax;
  t.dk = cmax * (col_ds.empty() ? 0.0 : *std::max_element(col_ds.begin(), col_ds.end())) * qmax;
  t.dv = (col_p.empty() ? 0.0 : *std::max_element(col_p.begin(), col_p.end())) * max_dout;
  t.dtau = row_dss / tmin;
  return t;
}

/// The sizes of the gradient error that an error of each row's δ = Σ_j P_ij h_ij
/// (MATH.md §6) brings, per unit of relative error: dS_ij moves by −P_ij Δδ_i,
/// and |Δδ_i| ≤ η H_i for weights each off by a relative η (the bfloat16
/// units' rounded W̃, test_storage16.cpp), with h_ij = dP_ij − dP_i,ref,
/// dP_ij = dO_i · v_j and H_i = Σ_j P_ij |h_ij|:
///   dq = c_max · max_i H_i · max|k|,   dk = c_max · max_j Σ_i P_ij H_i · max|q|
/// (Σ_j P_ij = 1). Only the far keys' weights are rounded (the near keys,
/// ref ± 1 for continuum, are summed in float): H_i sums over |j − ref_i| > 1
/// (continuum) or all j (softmax, h_i,ref = 0). ref_i, the kernel's reference
/// key, is the row's first key at its maximum score; H_i is the largest over
/// the keys within 2^-14 (relative) of that maximum, so that a near-tie the
/// kernel's rounded scores break the other way is covered. grad_out: dO,
/// [B, Hq, Lq, Dv] contiguous.
struct DeltaTermScales {
  double dq = 0, dk = 0;
};
template <class P, class F, class O>
DeltaTermScales delta_term_scales(const P& p, const F& f, const O& grad_out) {
  const auto d = [](const auto& x) { return static_cast<double>(to_ld(x)); };
  double tmin = 1e300;
  for (const auto& t : p.temperature) tmin = std::min(tmin, d(t));
  const double cmax = d(p.scale) / tmin, qmax = max_abs(p.query), kmax = max_abs(p.key);
  const index_t Lk = p.len_k, Dv = p.dim_v, near = p.kernel == continuum::Kernel::continuum ? 1 : 0;
  std::vector<double> col(static_cast<std::size_t>(p.batch * p.heads_kv * Lk), 0.0), dp(static_cast<std::size_t>(Lk));
  double hmax = 0;
  for (index_t b = 0; b < p.batch; ++b)
    for (index_t h = 0; h < p.heads_q; ++h)
      for (index_t i = 0; i < p.len_q; ++i) {
        const auto [lo, hi] = p.visible(b, i);
        if (lo >= hi) continue;
        const std::size_t row = p.row_index(b, h, i);
        const index_t g = p.kv_head(h);
        const auto prob = [&](index_t j) { return std::fabs(d(f.probs[row * std::size_t(Lk) + std::size_t(j)])); };
        const auto score = [&](index_t j) { return d(f.scores[row * std::size_t(Lk) + std::size_t(j)]); };
        double smax = -1e300;
        for (index_t j = lo; j < hi; ++j) {
          double acc = 0;
          for (index_t e = 0; e < Dv; ++e)
            acc += d(grad_out[row * std::size_t(Dv) + std::size_t(e)]) * d(p.value[p.v_index(b, g, j) + std::size_t(e)]);
          dp[std::size_t(j)] = acc;
          smax = std::max(smax, score(j));
        }
        double H = 0;
        for (index_t r = lo; r < hi; ++r) {
          if (score(r) < smax - std::ldexp(std::max(1.0, std::fabs(smax)), -14)) continue;
          double sum = 0;
          for (index_t j = lo; j < hi; ++j)
            if (j < r - near || j > r + near) sum += prob(j) * std::fabs(dp[std::size_t(j)] - dp[std::size_t(r)]);
          H = std::max(H, sum);
        }
        hmax = std::max(hmax, H);
        for (index_t j = lo; j < hi; ++j) col[std::size_t((b * p.heads_kv + g) * Lk + j)] += prob(j) * H;
      }
  DeltaTermScales t;
  t.dq = cmax * hmax * kmax;
  t.dk = cmax * (col.empty() ? 0.0 : *std::max_element(col.begin(), col.end())) * qmax;
  return t;
}

struct BackwardCheck {
  Error dq, dk, dv, dtau;
  double tol = 0, max_score = 0;
};

/// Runs the operator's forward then backward on c (loss Σ dO∘O with c.dout)
/// and compares dQ, dK, dV, dτ with the reference in R.
template <class R, class T>
BackwardCheck check_backward(Case<T>& c, const std::string& label) {
  c.forward();
  c.backward();
  const auto p = c.template problem<R>();
  const auto g = continuum::reference::backward(p, c.template grad_out_ref<R>());
  const auto f = continuum::reference::forward(p);
  BackwardCheck r;
  r.max_score = max_abs(f.scores);
  r.tol = backward_tolerance<T>(r.max_score, c.D);
  r.dq = compare(c.dq.contiguous(), g.grad_query);
  r.dk = compare(c.dk.contiguous(), g.grad_key);
  r.dv = compare(c.dv.contiguous(), g.grad_value);
  r.dtau = compare(c.dtau, g.grad_temperature);
  // A gradient that cancels to ~0 (e.g. dQ and dτ when every score in a row
  // is equal: Σ_j dS_ij = 0) has no meaningful max-abs; its rounding error is
  // relative to the sum of |terms|: the scale is max(max|ref|, term scale).
  {
    const GradTermScales t = grad_term_scales(p, f, g);
    r.dq.ref_scale = std::max(r.dq.ref_scale, t.dq);
    r.dk.ref_scale = std::max(r.dk.ref_scale, t.dk);
    r.dtau.ref_scale = std::max(r.dtau.ref_scale, t.dtau);
  }
  INFO("backward " << label << " " << type_name<T>() << " B=" << c.B << " Hq=" << c.Hq << " Hk=" << c.Hk
                   << " Lq=" << c.Lq << " Lk=" << c.Lk << " D=" << c.D << " Dv=" << c.dv_dim()
                   << " causal=" << c.vis.causal << " window=" << window_name(c.vis)
                   << " tshape=" << static_cast<int>(c.tshape) << " bshd=" << c.bshd
                   << " max|s|=" << r.max_score << " tol=" << r.tol);
  INFO("dQ " << r.dq.max_abs << "/" << r.dq.ref_scale << " at " << r.dq.worst << "; dK " << r.dk.max_abs << "/"
             << r.dk.ref_scale << " at " << r.dk.worst << "; dV " << r.dv.max_abs << "/" << r.dv.ref_scale
             << " at " << r.dv.worst << "; dtau " << r.dtau.max_abs << "/" << r.dtau.ref_scale << " at "
             << r.dtau.worst);
  const std::string t = type_name<T>();
  record("backward dQ " + label + " " + t, r.dq.rel());
  record("backward dK " + label + " " + t, r.dk.rel());
  record("backward dV " + label + " " + t, r.dv.rel());
  record("backward dtau " + label + " " + t, r.dtau.rel());
  auto ok = [&](const Error& e) { return e.max_abs <= r.tol * std::max(e.ref_scale, 1e-300); };
  CHECK(ok(r.dq));
  CHECK(ok(r.dk));
  CHECK(ok(r.dv));
  CHECK(ok(r.dtau));
  CHECK(c.dq.padding_untouched());
  CHECK(c.dk.padding_untouched());
  CHECK(c.dv.padding_untouched());
  if (std::is_same<T, float>::value && c.compute == continuum::Compute::automatic) {
    // Float storage with Compute::float64: each gradient rounded once from
    // double, relative to the same scales as above.
    c.compute = continuum::Compute::float64;
    c.forward();
    c.backward();
    c.compute = continuum::Compute::automatic;
    const double tol64 = std::ldexp(1.0, -24) + backward_tolerance<double>(r.max_score, c.D);
    Error e[4] = {compare(c.dq.contiguous(), g.grad_query), compare(c.dk.contiguous(), g.grad_key),
                  compare(c.dv.contiguous(), g.grad_value), compare(c.dtau, g.grad_temperature)};
    const Error* base[4] = {&r.dq, &r.dk, &r.dv, &r.dtau};
    const char* names[4] = {"dQ", "dK", "dV", "dtau"};
    for (int i = 0; i < 4; ++i) {
      INFO("Compute::float64 " << names[i] << ": max abs err " << e[i].max_abs << " at " << e[i].worst
                               << " (scale " << base[i]->ref_scale << "); tol " << tol64);
      record(std::string("backward ") + names[i] + " " + label + " float/compute float64",
             e[i].max_abs / std::max(base[i]->ref_scale, 1e-300));
      CHECK(e[i].max_abs <= tol64 * std::max(base[i]->ref_scale, 1e-300));
    }
  }
  return r;
}

/// Sets up a case's visibility from a small code (MATH.md §3): 0 full, 1 causal,
/// 2/3/4 causal with a window of 1/2/5 keys (left = 0/1/4), 5 non-causal
/// symmetric window (1, 1), 6 non-causal look-ahead window (0, 2).
inline continuum::Visibility visibility_code(int code) {
  continuum::Visibility v;
  v.causal = code >= 1 && code <= 4;
  v.window_left = code == 2 ? 0 : code == 3 ? 1 : code == 4 ? 4 : code == 5 ? 1 : code == 6 ? 0 : -1;
  v.window_right = code == 5 ? 1 : code == 6 ? 2 : -1;
  return v;
}


// ---------------------------------------------------------------------------
// Set-up shared by the operator, bug-case and property tests.

/// Only the per-head / per-query temperatures c.taus, uniform in [lo, hi)
/// (c.tau untouched). Call after alloc().
template <class T>
void random_taus(Case<T>& c, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  for (auto& t : c.taus) t = static_cast<T>(u(rng));
}

/// The scalar temperature c.tau, then every c.taus, uniform in [lo, hi) (in
/// that order of draws). Call after alloc().
template <class T>
void random_temperatures(Case<T>& c, std::mt19937_64& rng, double lo = 0.3, double hi = 2.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  c.tau = static_cast<T>(u(rng));
  random_taus(c, rng, lo, hi);
}

/// Explicit visibility ranges [B, Lq] (before alloc(), c.Lk ≥ 1): lo uniform
/// in [0, Lk), hi uniform in [lo, Lk] (empty rows included).
template <class T>
void random_ranges(Case<T>& c, std::mt19937_64& rng) {
  for (index_t b = 0; b < c.B; ++b)
    for (index_t i = 0; i < c.Lq; ++i) {
      const index_t lo = static_cast<index_t>(rng() % static_cast<unsigned>(c.Lk));
      const index_t hi = lo + static_cast<index_t>(rng() % static_cast<unsigned>(c.Lk - lo + 1));
      c.range_lo.push_back(lo);
      c.range_hi.push_back(hi);
    }
}

/// The arguments of one KV-cache decode step of c's (causal) forward: query
/// row t of every batch and head over keys [0, t + 1), out resized to
/// [B, Hq, 1, Dv] (contiguous) and lse to [B, Hq].
template <class T>
continuum::ForwardArgs<T> decode_step_args(Case<T>& c, index_t t, std::vector<T>& out, std::vector<T>& lse) {
  continuum::ForwardArgs<T> a = c.forward_args();
  a.query.data = c.q.view.row(0, 0, t);
  a.query.seq = 1;
  a.key.seq = t + 1;
  a.value.seq = t + 1;
  const index_t dv = c.dv_dim();
  out.assign(static_cast<std::size_t>(c.B * c.Hq * dv), T(0));
  lse.assign(static_cast<std::size_t>(c.B * c.Hq), T(0));
  a.out = continuum::TensorView<T>{out.data(), c.B, c.Hq, 1, dv, c.Hq * dv, dv, dv};
  a.lse = lse.data();
  return a;
}

// ---------------------------------------------------------------------------
// Checks and finite differences.

template <class T>
bool all_finite(const std::vector<T>& v) {
  for (T x : v)
    if (!std::isfinite(x)) return false;
  return true;
}
template <class T>
bool no_nan(const std::vector<T>& v) {
  for (T x : v)
    if (std::isnan(x)) return false;
  return true;
}
template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  // (memcmp must not see the null data() of an empty vector, even for 0 bytes)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// L = Σ dO∘O of the operator's forward on c (double): the loss whose
/// gradients attention_backward returns for grad_out = c.dout.
inline double forward_loss(Case<double>& c) {
  c.forward();
  double l = 0;
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.Hq; ++h)
      for (index_t i = 0; i < c.Lq; ++i)
        for (index_t d = 0; d < c.dv_dim(); ++d) l += c.dout.at(b, h, i, d) * c.o.at(b, h, i, d);
  return l;
}

/// Central difference (L(x + h) − L(x − h)) / (2h) of forward_loss in one
/// input element x of c (an element of c.q, c.k, c.v, c.tau or c.taus);
/// x is restored afterwards.
inline double central_difference(Case<double>& c, double& x, double h) {
  const double keep = x;
  x = keep + h;
  const double lp = forward_loss(c);
  x = keep - h;
  const double lm = forward_loss(c);
  x = keep;
  return (lp - lm) / (2 * h);
}

#if defined(CONTINUUM_CPU_DISPATCH)
/// Puts the dispatch library's selected instruction set back at scope exit.
struct RestoreIsa {
  continuum::cpu_dispatch::Isa saved = continuum::cpu_dispatch::selected();
  ~RestoreIsa() { continuum::cpu_dispatch::select(saved); }
};
/// Whether bfloat16 calls run their products on a bfloat16 unit (AVX512-BF16
/// or AMX, backends/cpu/bf16_products.hpp) rather than in float FMA.
inline bool on_bf16_unit() {
  namespace cd = continuum::cpu_dispatch;
  return cd::selected() == cd::Isa::avx512bf16 || cd::selected() == cd::Isa::amx;
}
#else
inline bool on_bf16_unit() {
  namespace bf16 = continuum::cpu_detail::bf16;
  return bf16::amx_usable() || bf16::avx512bf16_preferred();
}
#endif

/// f() on every vector instruction set this CPU runs (sse2, avx2, avx512),
/// each selected in turn, the ones it cannot run reported as skipped: the
/// kernels whose products are the float call's. A build without the dispatch
/// library (its own -march) runs f() once, unless S is bfloat16 and its
/// kernels use a bfloat16 unit (`unit_skip` says why that is skipped).
template <class S, class F>
void for_each_vector_isa(const char* what, const char* unit_skip, F&& f) {
#if defined(CONTINUUM_CPU_DISPATCH)
  namespace cd = continuum::cpu_dispatch;
  (void)unit_skip;
  RestoreIsa restore;
  for (cd::Isa isa : {cd::Isa::sse2, cd::Isa::avx2, cd::Isa::avx512}) {
    if (!cd::supported(isa)) {
      WARN("skipped: " << what << " on " << cd::name(isa) << " (this CPU cannot run it)");
      continue;
    }
    cd::select(isa);
    INFO("instruction set " << cd::name(isa));
    f();
  }
#else
  if (std::is_same<S, continuum::bfloat16>::value && on_bf16_unit()) WARN("skipped: " << what << ": " << unit_skip);
  else f();
#endif
}

}  // namespace harness
