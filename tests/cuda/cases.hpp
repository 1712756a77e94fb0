// tests/cuda/cases.hpp — operator cases shared by the CUDA test (GPU) and the
// kernel-emulation test (host), a straightforward O(Lq·Lk) double reference
// written from MATH.md §4 and §6 (the per-element stencil from math/density.hpp),
// and the comparisons with their tolerances.
//
// Tolerances (tests/cuda/runner.hpp applies them elementwise):
//  * fp32 arithmetic: |x − ref| ≤ e32 = tol·max|ref| + 2·max|naive32 − ref|,
//    tol = 1e-5, where naive32 is this same reference run in float (FlashAttention's
//    test criterion err(ours) ≤ k·err(naive) + atol, k = 2): the
//    1e-5 term is the bound for well-conditioned inputs; the naive term
//    admits what fp32 itself cannot resolve (e.g. τ = 1e-3, W12, where scores of
//    size 1e4 carry absolute errors ~1e-3 in any fp32 code). naive32 forms
//    Dl_i = dO_i·o_i from the kernel's o as MATH.md §6 writes it; the kernels
//    (and the CPU backend) form Dl from P and dP relative to the row's
//    reference key instead, which does not cancel where P is concentrated, so
//    at small τ this bound is loose: test_cuda_emulated's W12 test holds the
//    kernels to a derived bound against a 640-bit reference there.
//  * bf16 / fp16 storage, fp32 accumulation: the reference runs on the very
//    same 16-bit values (q, k, v, dO, and the kernel's own o for naive32's D_i), so the
//    differences are the fp32 arithmetic (e32 above) and one final
//    round-to-nearest into the 16-bit type, ≤ u·|x| with u = 2^-p the unit
//    roundoff: u = 2^-8 for bf16 (p = 8 significand bits), 2^-11 for fp16 (p = 11):
//        |x − ref| ≤ u·|ref| + (1 + u)·e32.
//    lse and dτ stay fp32 (accum_t), so they keep the fp32 bound.
//  * dτ: e32 uses Σ_j |dS_ij s_ij| / τ_i (summed over the rows sharing τ) in
//    place of max|ref|, since Σ_j dS_ij = 0 makes the terms cancel.
//  * double (emulation only): tol = 1e-12, no naive term.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <continuum/attention/params.hpp>
#include <continuum/math/density.hpp>

namespace cuda_test {

using continuum::index_t;
using continuum::Kernel;
using continuum::TemperatureShape;

struct Case {
  std::string name;
  index_t B = 1, Hq = 1, Hk = 1, Lq = 8, Lk = 8, D = 8, Dv = 8;
  Kernel kernel = Kernel::continuum;
  bool causal = false;
  index_t window_left = -1, window_right = -1;  // MATH.md §3; negative = unlimited
  std::vector<index_t> range_lo, range_hi;  // [B, Lq] each, or empty
  TemperatureShape tshape = TemperatureShape::scalar;
  double tau = 1.0;
  std::optional<double> scale{};
  index_t pad = 0;      // extra elements per row (stride D + pad), filled with NaN
  double qk_gain = 2.0; // q, k uniform in [-gain, gain]; v, dO in [-1, 1]
  std::uint32_t seed = 1;
  /// Tolerance for double storage when the default 1e-12 is below what the
  /// case's conditioning allows (0 = default).
  double fp64_tol = 0;
  /// Overwrites chosen inputs after the random fill (e.g. W13's huge q, k).
  std::function<void(struct Inputs&)> tweak{};
};

/// A padded BHSD tensor in double.
struct Tensor {
  index_t B = 0, H = 0, S = 0, D = 0, pad = 0;
  std::vector<double> data;
  index_t ld() const { return D + pad; }
  double& at(index_t b, index_t h, index_t s, index_t d) { return data[((b * H + h) * S + s) * ld() + d]; }
  double at(index_t b, index_t h, index_t s, index_t d) const {
    return data[((b * H + h) * S + s) * ld() + d];
  }
  static Tensor make(index_t B, index_t H, index_t S, index_t D, index_t pad) {
    Tensor t{B, H, S, D, pad, {}};
    t.data.assign(static_cast<std::size_t>(B * H * S * (D + pad)), std::nan(""));
    return t;
  }
  template <class F> void fill(F f) {
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t s = 0; s < S; ++s)
          for (index_t d = 0; d < D; ++d) at(b, h, s, d) = f();
  }
  template <class F> void round_with(F f) {
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t s = 0; s < S; ++s)
          for (index_t d = 0; d < D; ++d) at(b, h, s, d) = f(at(b, h, s, d));
  }
};

struct Inputs {
  Tensor q, k, v, dout;
  std::vector<double> tau;  // scalar: 1 value; per_head: Hq; per_query: B*Hq*Lq
};

inline Inputs make_inputs(const Case& c) {
  std::mt19937 gen(c.seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Inputs in;
  in.q = Tensor::make(c.B, c.Hq, c.Lq, c.D, c.pad);
  in.k = Tensor::make(c.B, c.Hk, c.Lk, c.D, c.pad);
  in.v = Tensor::make(c.B, c.Hk, c.Lk, c.Dv, c.pad);
  in.dout = Tensor::make(c.B, c.Hq, c.Lq, c.Dv, c.pad);
  in.q.fill([&] { return c.qk_gain * u(gen); });
  in.k.fill([&] { return c.qk_gain * u(gen); });
  in.v.fill([&] { return u(gen); });
  in.dout.fill([&] { return u(gen); });
  if (c.tweak) c.tweak(in);
  std::uniform_real_distribution<double> ut(0.3, 1.5);
  if (c.tshape == TemperatureShape::scalar) in.tau = {c.tau};
  if (c.tshape == TemperatureShape::per_head)
    for (index_t h = 0; h < c.Hq; ++h) in.tau.push_back(ut(gen));
  if (c.tshape == TemperatureShape::per_query)
    for (index_t x = 0; x < c.B * c.Hq * c.Lq; ++x) in.tau.push_back(ut(gen));
  return in;
}

inline void visible(const Case& c, index_t b, index_t i, index_t& lo, index_t& hi) {
  hi = c.Lk;
  lo = 0;
  if (c.causal) hi = std::min(c.Lk, i + (c.Lk - c.Lq) + 1);
  const index_t d = i + (c.Lk - c.Lq);  // the diagonal key
  if (c.window_left >= 0) lo = std::max<index_t>(lo, d - c.window_left);
  if (c.window_right >= 0) hi = std::min<index_t>(hi, d + c.window_right + 1);
  if (!c.range_lo.empty()) lo = std::max(lo, c.range_lo[b * c.Lq + i]);
  if (!c.range_hi.empty()) hi = std::min(hi, c.range_hi[b * c.Lq + i]);
  lo = std::max<index_t>(lo, 0);
  hi = std::min(hi, c.Lk);
  if (hi < lo) hi = lo;
}

inline double tau_of(const Case& c, const Inputs& in, index_t b, index_t h, index_t i) {
  if (c.tshape == TemperatureShape::per_head) return in.tau[h];
  if (c.tshape == TemperatureShape::per_query) return in.tau[(b * c.Hq + h) * c.Lq + i];
  return in.tau[0];
}

struct Outputs {
  Tensor o, dq, dk, dv;
  std::vector<double> lse;
  std::vector<double> dtau;      // shape of the temperature
  std::vector<double> dtau_abs;  // Σ |row terms| per dτ element (the tolerance scale)
  // Σ |terms| of each gradient element (the scale of a sum that may cancel):
  // dQ_id: Σ_j |c dS_ij k_jd|, dK_jd: Σ_i |c dS_ij q_id|, dV_jd: Σ_i |P_ij dO_id|.
  Tensor dq_abs, dk_abs, dv_abs;
  std::vector<char> empty;       // per (b, h, i)
};

/// The reference: forward (o, lse) from q, k, v; backward from q, k, v, dO and
/// `o_for_delta` (the o whose D_i = dO_i·o_i this backward uses, MATH.md §6 as
/// written; pass the kernel's own o so that the naive fp32 run sees it).
template <class Stencil, class R>
Outputs reference_with(const Case& c, const Inputs& in, const Tensor* o_for_delta) {
  const R ninf = -std::numeric_limits<R>::infinity();
  Outputs r;
  r.o = Tensor::make(c.B, c.Hq, c.Lq, c.Dv, 0);
  r.dq = Tensor::make(c.B, c.Hq, c.Lq, c.D, 0);
  r.dq_abs = Tensor::make(c.B, c.Hq, c.Lq, c.D, 0);
  r.dk_abs = Tensor::make(c.B, c.Hk, c.Lk, c.D, 0);
  r.dv_abs = Tensor::make(c.B, c.Hk, c.Lk, c.Dv, 0);
  for (auto* t : {&r.dq_abs, &r.dk_abs, &r.dv_abs}) std::fill(t->data.begin(), t->data.end(), 0.0);
  r.dk = Tensor::make(c.B, c.Hk, c.Lk, c.D, 0);
  r.dv = Tensor::make(c.B, c.Hk, c.Lk, c.Dv, 0);
  for (auto* t : {&r.dq, &r.dk, &r.dv}) std::fill(t->data.begin(), t->data.end(), 0.0);
  r.lse.assign(c.B * c.Hq * c.Lq, double(ninf));
  r.empty.assign(c.B * c.Hq * c.Lq, 0);
  r.dtau.assign(in.tau.size(), 0.0);
  r.dtau_abs.assign(in.tau.size(), 0.0);
  const index_t group = c.Hq / c.Hk;
  const R scale = R(c.scale.value_or(1.0 / std::sqrt(double(c.D))));
  std::vector<R> s(c.Lk + 2), alpha(c.Lk), dp(c.Lk), dalpha(c.Lk + 2), ds(c.Lk);
  std::vector<R> acc_dq(c.D), acc_o(c.Dv);
  std::vector<double> abs_dq(c.D);
  Tensor dk_acc = r.dk, dv_acc = r.dv;  // accumulated in R, rounded per add
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.Hq; ++h)
      for (index_t i = 0; i < c.Lq; ++i) {
        const index_t hk = h / group, row = (b * c.Hq + h) * c.Lq + i;
        index_t lo, hi;
        visible(c, b, i, lo, hi);
        if (lo >= hi) {
          r.empty[row] = 1;
          for (index_t d = 0; d < c.Dv; ++d) r.o.at(b, h, i, d) = 0.0;
          continue;
        }
        const R tau = R(tau_of(c, in, b, h, i)), cs = scale / tau;
        // s[j + 1] holds s_j; s[lo] and s[hi + 1] are the -inf outside neighbours.
        R m = ninf;
        std::fill(s.begin(), s.end(), ninf);
        for (index_t j = lo; j < hi; ++j) {
          R acc = 0;
          for (index_t d = 0; d < c.D; ++d) acc += (cs * R(in.q.at(b, h, i, d))) * R(in.k.at(b, hk, j, d));
          s[j + 1] = acc;
          m = std::max(m, s[j + 1]);
        }
        R z = 0;
        for (index_t j = lo; j < hi; ++j) {
          alpha[j] = Stencil::weight(s[j] - m, s[j + 1] - m, s[j + 2] - m, j - 1 >= lo, j + 1 < hi);
          z += alpha[j];
        }
        r.lse[row] = double(m + std::log(z));
        for (index_t d = 0; d < c.Dv; ++d) {
          R acc = 0;
          for (index_t j = lo; j < hi; ++j) acc += alpha[j] * R(in.v.at(b, hk, j, d));
          r.o.at(b, h, i, d) = double(acc / z);
        }
        // Backward (MATH.md §6): dα_j = (dP_j - D)/Z, then the tridiagonal dS.
        const Tensor& ob = o_for_delta ? *o_for_delta : r.o;
        R delta = 0;
        for (index_t d = 0; d < c.Dv; ++d) delta += R(in.dout.at(b, h, i, d)) * R(ob.at(b, h, i, d));
        std::fill(dalpha.begin(), dalpha.end(), R(0));
        for (index_t j = lo; j < hi; ++j) {
          R acc = 0;
          for (index_t d = 0; d < c.Dv; ++d) acc += R(in.dout.at(b, h, i, d)) * R(in.v.at(b, hk, j, d));
          dp[j] = acc;
          dalpha[j + 1] = (acc - delta) / z;  // dalpha[j+1] holds dα_j
        }
        R dtau_row = 0;
        double dtau_row_abs = 0;
        std::fill(acc_dq.begin(), acc_dq.end(), R(0));
        std::fill(abs_dq.begin(), abs_dq.end(), 0.0);
        for (index_t j = lo; j < hi; ++j) {
          const R sl = s[j] - m, sc = s[j + 1] - m, sr = s[j + 2] - m;
          const bool hl = j - 1 >= lo, hr = j + 1 < hi;
          R g = dalpha[j + 1] * Stencil::weight_ds(sl, sc, sr, hl, hr);
          if (hl) g += dalpha[j] * Stencil::coupling(sl, sc);
          if (hr) g += dalpha[j + 2] * Stencil::coupling(sr, sc);
          ds[j] = g;
          dtau_row += g * s[j + 1];
          dtau_row_abs += std::abs(double(g) * double(s[j + 1]));
          const R p = alpha[j] / z;
          for (index_t d = 0; d < c.D; ++d) {
            acc_dq[d] += g * R(in.k.at(b, hk, j, d));
            abs_dq[d] += std::abs(double(g) * in.k.at(b, hk, j, d));
            r.dk_abs.at(b, hk, j, d) += std::abs(double(g) * double(cs) * in.q.at(b, h, i, d));
            dk_acc.at(b, hk, j, d) = double(R(dk_acc.at(b, hk, j, d)) + g * (cs * R(in.q.at(b, h, i, d))));
          }
          for (index_t d = 0; d < c.Dv; ++d) {
            dv_acc.at(b, hk, j, d) = double(R(dv_acc.at(b, hk, j, d)) + p * R(in.dout.at(b, h, i, d)));
            r.dv_abs.at(b, hk, j, d) += std::abs(double(p) * in.dout.at(b, h, i, d));
          }
        }
        for (index_t d = 0; d < c.D; ++d) {
          r.dq.at(b, h, i, d) = double(cs * acc_dq[d]);
          r.dq_abs.at(b, h, i, d) = std::abs(double(cs)) * abs_dq[d];
        }
        const R term = -dtau_row / tau;
        const std::size_t t = c.tshape == TemperatureShape::scalar     ? 0
                              : c.tshape == TemperatureShape::per_head ? std::size_t(h)
                                                                       : std::size_t(row);
        r.dtau[t] = double(R(r.dtau[t]) + term);
        // The conditioning scale of dτ: Σ_j |dS_ij s_ij| / τ_i (the terms cancel: Σ_j dS_ij = 0).
        r.dtau_abs[t] += dtau_row_abs / double(tau);
      }
  r.dk = dk_acc;
  r.dv = dv_acc;
  return r;
}

template <class R = double>
Outputs reference(const Case& c, const Inputs& in, const Tensor* o_for_delta = nullptr) {
  return c.kernel == Kernel::continuum
             ? reference_with<continuum::ContinuumStencil, R>(c, in, o_for_delta)
             : reference_with<continuum::SoftmaxStencil, R>(c, in, o_for_delta);
}

}  // namespace cuda_test
