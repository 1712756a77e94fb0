// tests/cuda/runner.hpp — runs one Case through an executor (the GPU, or the
// host emulation of the kernels) and measures it against the reference.
//
// Exec provides: template <class T> T* upload(const std::vector<T>&);
// template <class T> std::vector<T> download(const T*, std::size_t);
// void forward(const ForwardArgs<E>&); void backward(const BackwardArgs<E>&).
// Conv provides: static E to(double); static double from(E); static double u
// (the unit roundoff of the final rounding into E, 0 for float/double).
#pragma once

#include <cstring>
#include <type_traits>
#include <limits>

#include <continuum/continuum.hpp>

#include "cases.hpp"

namespace cuda_test {

/// Each field: the largest |x − ref| / budget (≤ 1 passes); see cases.hpp.
struct Result {
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0, dtau = 0;
  bool empty_rows_exact = true;  // o = 0, lse = -inf, dq = 0 on empty rows
  bool padding_untouched = true; // NaN padding of every output row still NaN
  std::vector<unsigned char> bytes;  // o, lse, dq, dk, dv, dτ as produced (for bitwise checks)
};

template <class E, class Conv>
std::vector<E> to_storage(const Tensor& t) {
  std::vector<E> r(t.data.size());
  for (std::size_t x = 0; x < r.size(); ++x) r[x] = Conv::to(t.data[x]);
  return r;
}
template <class E, class Conv>
Tensor from_storage(const std::vector<E>& v, index_t B, index_t H, index_t S, index_t D, index_t pad) {
  Tensor t = Tensor::make(B, H, S, D, pad);
  for (std::size_t x = 0; x < v.size(); ++x) t.data[x] = Conv::from(v[x]);
  return t;
}
template <class E>
continuum::TensorView<E> view(E* p, const Tensor& t) {
  return {p, t.B, t.H, t.S, t.D, t.H * t.S * t.ld(), t.S * t.ld(), t.ld()};
}
template <class T>
void append_bytes(std::vector<unsigned char>& out, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  out.insert(out.end(), p, p + v.size() * sizeof(T));
}

inline bool padding_is_nan(const Tensor& t) {
  for (index_t x = 0; x < index_t(t.data.size()); ++x)
    if (x % t.ld() >= t.D && !std::isnan(t.data[x])) return false;
  return true;
}

/// The CPU backend (op's attention_forward/backward(continuum::cpu, ...)) in
/// double on the same inputs: the reference the CUDA results are measured
/// against. `o_for_delta` is passed as `out` (neither the CPU backend nor the
/// CUDA kernels read it: both form Dl from P and dP); `empty` and `dtau_abs`
/// come from cases.hpp's reference (they are not outputs of the operator).
inline Outputs cpu_reference(const Case& c, const Inputs& in, const Tensor& o_for_delta) {
  using continuum::TensorView;
  Outputs r = reference(c, in, &o_for_delta);
  auto cview = [](const Tensor& t) {
    return TensorView<const double>{t.data.data(), t.B, t.H, t.S, t.D, t.H * t.S * t.ld(),
                                    t.S * t.ld(), t.ld()};
  };
  auto mview = [](Tensor& t) {
    return TensorView<double>{t.data.data(), t.B, t.H, t.S, t.D, t.H * t.S * t.ld(), t.S * t.ld(),
                              t.ld()};
  };
  continuum::ForwardArgs<double> fa;
  fa.query = cview(in.q);
  fa.key = cview(in.k);
  fa.value = cview(in.v);
  fa.out = mview(r.o);
  fa.lse = r.lse.data();
  fa.kernel = c.kernel;
  fa.temperature.shape = c.tshape;
  fa.temperature.value = in.tau[0];
  fa.temperature.data = c.tshape == TemperatureShape::scalar ? nullptr : in.tau.data();
  fa.scale = c.scale;
  fa.visibility.causal = c.causal;
  fa.visibility.window_left = c.window_left;
  fa.visibility.window_right = c.window_right;
  fa.visibility.range_lo = c.range_lo.empty() ? nullptr : c.range_lo.data();
  fa.visibility.range_hi = c.range_hi.empty() ? nullptr : c.range_hi.data();
  continuum::attention_forward(continuum::cpu, fa);
  std::vector<double> lse(r.lse);
  continuum::BackwardArgs<double> ba;
  ba.query = fa.query;
  ba.key = fa.key;
  ba.value = fa.value;
  ba.out = cview(o_for_delta);
  ba.grad_out = cview(in.dout);
  ba.lse = lse.data();
  ba.grad_query = mview(r.dq);
  ba.grad_key = mview(r.dk);
  ba.grad_value = mview(r.dv);
  ba.grad_temperature = r.dtau.data();
  ba.kernel = c.kernel;
  ba.temperature = fa.temperature;
  ba.scale = c.scale;
  ba.visibility = fa.visibility;
  continuum::attention_backward(continuum::cpu, ba);
  return r;
}

template <class E, class Conv, class Exec>
Result run_case(const Case& c, Exec& ex, double tol, double storage_tiny = 0) {
  using A = continuum::accum_t<E>;
  if (std::is_same<A, double>::value && c.fp64_tol > 0) tol = c.fp64_tol;
  const double u = Conv::u;
  Inputs in = make_inputs(c);
  for (Tensor* t : {&in.q, &in.k, &in.v, &in.dout})
    t->round_with([](double x) { return Conv::from(Conv::to(x)); });
  std::vector<A> tau_a(in.tau.begin(), in.tau.end());
  for (std::size_t x = 0; x < tau_a.size(); ++x) in.tau[x] = double(tau_a[x]);

  E* q = ex.upload(to_storage<E, Conv>(in.q));
  E* k = ex.upload(to_storage<E, Conv>(in.k));
  E* v = ex.upload(to_storage<E, Conv>(in.v));
  E* go = ex.upload(to_storage<E, Conv>(in.dout));
  Tensor o_shape = Tensor::make(c.B, c.Hq, c.Lq, c.Dv, c.pad);
  E* o = ex.upload(to_storage<E, Conv>(o_shape));  // NaN everywhere
  const std::size_t rows = std::size_t(c.B * c.Hq * c.Lq);
  A* lse = ex.upload(std::vector<A>(rows + 1, A(std::nan(""))));
  A* tau_d = c.tshape == TemperatureShape::scalar ? nullptr : ex.upload(tau_a);
  index_t* rlo = c.range_lo.empty() ? nullptr : ex.upload(c.range_lo);
  index_t* rhi = c.range_hi.empty() ? nullptr : ex.upload(c.range_hi);

  continuum::ForwardArgs<E> fa;
  fa.query = view<const E>(q, in.q);
  fa.key = view<const E>(k, in.k);
  fa.value = view<const E>(v, in.v);
  fa.out = view<E>(o, o_shape);
  fa.lse = lse;
  fa.kernel = c.kernel;
  fa.temperature.shape = c.tshape;
  fa.temperature.value = A(c.tau);
  fa.temperature.data = tau_d;
  fa.scale = c.scale;
  fa.visibility.causal = c.causal;
  fa.visibility.window_left = c.window_left;
  fa.visibility.window_right = c.window_right;
  fa.visibility.range_lo = rlo;
  fa.visibility.range_hi = rhi;
  ex.forward(fa);
  const auto o_raw = ex.template download<E>(o, o_shape.data.size());
  const auto lse_raw = ex.template download<A>(lse, rows);
  const Tensor o_got = from_storage<E, Conv>(o_raw, c.B, c.Hq, c.Lq, c.Dv, c.pad);

  // Backward, with every output pre-filled with NaN (padding must stay NaN).
  Tensor dq_shape = Tensor::make(c.B, c.Hq, c.Lq, c.D, c.pad);
  Tensor dk_shape = Tensor::make(c.B, c.Hk, c.Lk, c.D, c.pad);
  Tensor dv_shape = Tensor::make(c.B, c.Hk, c.Lk, c.Dv, c.pad);
  E* dq = ex.upload(to_storage<E, Conv>(dq_shape));
  E* dk = ex.upload(to_storage<E, Conv>(dk_shape));
  E* dv = ex.upload(to_storage<E, Conv>(dv_shape));
  A* dtau = ex.upload(std::vector<A>(in.tau.size(), A(std::nan(""))));
  continuum::BackwardArgs<E> ba;
  ba.query = fa.query;
  ba.key = fa.key;
  ba.value = fa.value;
  ba.out = view<const E>(o, o_shape);
  ba.grad_out = view<const E>(go, in.dout);
  ba.lse = lse;
  ba.grad_query = view<E>(dq, dq_shape);
  ba.grad_key = view<E>(dk, dk_shape);
  ba.grad_value = view<E>(dv, dv_shape);
  ba.grad_temperature = dtau;
  ba.kernel = c.kernel;
  ba.temperature = fa.temperature;
  ba.scale = c.scale;
  ba.visibility = fa.visibility;
  ex.backward(ba);
  const auto dq_raw = ex.template download<E>(dq, dq_shape.data.size());
  const auto dk_raw = ex.template download<E>(dk, dk_shape.data.size());
  const auto dv_raw = ex.template download<E>(dv, dv_shape.data.size());
  const auto dtau_raw = ex.template download<A>(dtau, in.tau.size());

  const Tensor dq_got = from_storage<E, Conv>(dq_raw, c.B, c.Hq, c.Lq, c.D, c.pad);
  const Tensor dk_got = from_storage<E, Conv>(dk_raw, c.B, c.Hk, c.Lk, c.D, c.pad);
  const Tensor dv_got = from_storage<E, Conv>(dv_raw, c.B, c.Hk, c.Lk, c.Dv, c.pad);
  const Outputs ref = cpu_reference(c, in, o_got);
  // fp32 arithmetic (float and 16-bit storage): also the same algorithm run
  // naively in fp32, for the err ≤ 2·err_naive + tol·max|ref| criterion.
  const bool fp32 = !std::is_same<A, double>::value;
  Outputs naive;
  if (fp32) naive = reference<float>(c, in, &o_got);
  Result r;
  // WithinAbs(0, tiny) near 0 (a relative bound means nothing there): a tensor whose reference is exactly
  // 0 (W13: every weight but one underflows) may differ by 1e-30 absolute;
  // fp16 storage adds half its subnormal spacing (storage_tiny = 2^-25).
  const double abs_floor = std::max(1e-30, storage_tiny);
  auto tensor_err = [&](const Tensor& got, const Tensor& rf, const Tensor& nv) {
    double e_naive = 0;
    if (fp32)
      for (std::size_t x = 0; x < rf.data.size(); ++x)
        e_naive = std::max(e_naive, std::abs(nv.data[x] - rf.data[x]));
    double mag = 0;
    for (double e : rf.data) mag = std::max(mag, std::abs(e));
    // e32: the fp32 arithmetic's budget; u: the final rounding into E.
    const double e32 = tol * mag + 2 * e_naive;
    double worst = 0;
    for (index_t b = 0; b < rf.B; ++b)
      for (index_t h = 0; h < rf.H; ++h)
        for (index_t s2 = 0; s2 < rf.S; ++s2)
          for (index_t d = 0; d < rf.D; ++d) {
            const double a = got.at(b, h, s2, d), e = rf.at(b, h, s2, d);
            if (!std::isfinite(a)) return std::numeric_limits<double>::infinity();
            const double budget = u * std::abs(e) + (1 + u) * e32 + abs_floor;
            worst = std::max(worst, std::abs(a - e) / budget);
          }
    return worst;
  };
  r.o = tensor_err(o_got, ref.o, naive.o);
  r.dq = tensor_err(dq_got, ref.dq, naive.dq);
  r.dk = tensor_err(dk_got, ref.dk, naive.dk);
  r.dv = tensor_err(dv_got, ref.dv, naive.dv);
  double lse_mag = 1, lse_naive = 0;
  for (std::size_t x = 0; x < rows; ++x)
    if (!ref.empty[x]) {
      lse_mag = std::max(lse_mag, std::abs(ref.lse[x]));
      if (fp32) lse_naive = std::max(lse_naive, std::abs(naive.lse[x] - ref.lse[x]));
    }
  for (std::size_t x = 0; x < rows; ++x) {
    const double g = double(lse_raw[x]);
    if (ref.empty[x]) {
      if (!(std::isinf(g) && g < 0)) r.empty_rows_exact = false;
      continue;
    }
    const double e = std::isfinite(g) ? std::abs(g - ref.lse[x]) / (tol * lse_mag + 2 * lse_naive)
                                      : std::numeric_limits<double>::infinity();
    r.lse = std::max(r.lse, e);
  }
  for (std::size_t x = 0; x < in.tau.size(); ++x) {
    const double g = double(dtau_raw[x]);
    const double e_naive = fp32 ? std::abs(naive.dtau[x] - ref.dtau[x]) : 0.0;
    const double budget = tol * ref.dtau_abs[x] + 2 * e_naive + abs_floor;
    r.dtau = std::max(r.dtau, std::isfinite(g) ? std::abs(g - ref.dtau[x]) / budget
                                               : std::numeric_limits<double>::infinity());
  }
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.Hq; ++h)
      for (index_t i = 0; i < c.Lq; ++i) {
        if (!ref.empty[(b * c.Hq + h) * c.Lq + i]) continue;
        for (index_t d = 0; d < c.Dv; ++d)
          if (o_got.at(b, h, i, d) != 0.0 || std::signbit(o_got.at(b, h, i, d))) r.empty_rows_exact = false;
        for (index_t d = 0; d < c.D; ++d)
          if (dq_got.at(b, h, i, d) != 0.0) r.empty_rows_exact = false;
      }
  r.padding_untouched = padding_is_nan(o_got) && padding_is_nan(dq_got) &&
                        padding_is_nan(dk_got) && padding_is_nan(dv_got);
  append_bytes(r.bytes, o_raw);
  append_bytes(r.bytes, lse_raw);
  append_bytes(r.bytes, dq_raw);
  append_bytes(r.bytes, dk_raw);
  append_bytes(r.bytes, dv_raw);
  append_bytes(r.bytes, dtau_raw);
  return r;
}

/// The case list both the GPU and the emulation run (names say what they cover;
/// W-ids are MATH.md appendix A).
inline std::vector<Case> standard_cases() {
  std::vector<Case> cs;
  auto add = [&](Case c) { cs.push_back(c); };
  for (Kernel kern : {Kernel::continuum, Kernel::softmax, Kernel::focal}) {
    const std::string kn = continuum::kernel_name(kern);
    Case c;
    c.kernel = kern;
    c.name = kn + " full 17x23 D=9";
    c.Lq = 17; c.Lk = 23; c.D = 9; c.Dv = 5;
    add(c);
    c.name = kn + " causal Lq<Lk (W03)";
    c.causal = true; c.Lq = 3; c.Lk = 5;
    add(c);
    c.name = kn + " causal Lq>Lk, first rows empty (W03)";
    c.Lq = 5; c.Lk = 3;
    add(c);
    c.name = kn + " decode Lq=1 over cache (W03/W05)";
    c.Lq = 1; c.Lk = 16;
    add(c);
    c.name = kn + " causal window 5, partial tiles, per-query tau (W08)";
    c.Lq = c.Lk = 33; c.window_left = 4; c.window_right = 0; c.tshape = TemperatureShape::per_query;
    add(c);
    c.name = kn + " non-causal window (3, 2) around the diagonal, Lq<Lk";
    c.causal = false; c.Lq = 20; c.Lk = 37; c.window_left = 3; c.window_right = 2;
    add(c);
    c = Case{};
    c.kernel = kern;
    c.name = kn + " GQA 6/2 heads, batch 2, per-head tau";
    c.B = 2; c.Hq = 6; c.Hk = 2; c.Lq = 19; c.Lk = 21; c.D = 16; c.Dv = 16;
    c.tshape = TemperatureShape::per_head;
    add(c);
  }
  {
    Case c;
    c.name = "W01 explicit ranges, rows 4-7 empty";
    c.Lq = c.Lk = 8;
    for (index_t i = 0; i < 8; ++i) {
      c.range_lo.push_back(i < 4 ? 0 : 0);
      c.range_hi.push_back(i < 4 ? 4 : 0);
    }
    add(c);
  }
  {
    Case c;
    c.name = "W02 per-row ranges [i-1, i], padded batch item";
    c.B = 2; c.Lq = c.Lk = 3; c.D = 1; c.Dv = 1;
    for (index_t b = 0; b < 2; ++b)
      for (index_t i = 0; i < 3; ++i) {
        c.range_lo.push_back(std::max<index_t>(0, i - 1));
        c.range_hi.push_back(b == 1 ? std::min<index_t>(i + 1, 1) : i + 1);
      }
    add(c);
  }
  {
    Case c;
    c.name = "W04 Lk = 0";
    c.Lq = 2; c.Lk = 0;
    add(c);
    c.name = "W04 Lq = 0";
    c.Lq = 0; c.Lk = 4;
    add(c);
    c.name = "W04 key counts [0,2,0,2]";
    c.B = 4; c.Lq = 2; c.Lk = 2;
    for (index_t b = 0; b < 4; ++b)
      for (index_t i = 0; i < 2; ++i) {
        c.range_lo.push_back(0);
        c.range_hi.push_back(b % 2 == 0 ? 0 : 2);
      }
    add(c);
  }
  for (index_t d : {1, 2, 3, 5, 7, 8, 9, 15, 17, 63, 65, 80, 129}) {
    Case c;
    c.name = "W06 head_dim " + std::to_string(d) + " stride D+1 NaN padding";
    c.Lq = c.Lk = 7; c.D = d; c.Dv = d; c.pad = 1; c.causal = d % 2 == 1;
    add(c);
  }
  {
    Case c;
    c.name = "head_dim 256, value dim 192";
    c.Lq = 9; c.Lk = 11; c.D = 256; c.Dv = 192;
    add(c);
  }
  {
    Case c;
    c.name = "W12 tiny temperature 1e-3";
    c.Lq = 3; c.Lk = 5; c.D = 4; c.tau = 1e-3;
    c.fp64_tol = 1e-10;  // scores ~1e4: ε·|s| ≈ 2e-12 absolute in each score
    add(c);
    c.name = "equal scores (q = 0 gain): softmax-equal weights";
    c.tau = 1; c.qk_gain = 0; c.fp64_tol = 0;
    add(c);
  }
  for (double tau : {1.0, 2.0}) {
    Case c;
    c.name = "W13 |q·k| = 4e38 > FLT_MAX, tau " + std::to_string(tau);
    c.Lq = 1; c.Lk = 3; c.D = 4; c.Dv = 4; c.tau = tau;
    c.tweak = [](Inputs& in) {
      for (index_t d = 0; d < 4; ++d) {
        in.q.at(0, 0, 0, d) = 1e19;
        in.k.at(0, 0, 0, d) = 1e19;
        in.k.at(0, 0, 1, d) = 0.9e19;
        in.k.at(0, 0, 2, d) = -1e19;
      }
    };
    add(c);
  }
  return cs;
}

}  // namespace cuda_test
