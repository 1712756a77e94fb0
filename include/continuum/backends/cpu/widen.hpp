// backends/cpu/widen.hpp — float storage computed in double (Compute::float64,
// and the rows float cannot hold): the call's arguments converted to double
// once, so that the one tiled kernel family runs on them in double, and the
// outputs rounded back to float once each (docs/MATH.md §10).
//
// Every element is converted (exactly: float ⊂ double), hidden ones included;
// the kernels never read those (masking is structural), so what a row cannot
// see still never reaches its result. Memory: a double copy of the inputs and
// outputs, 2× their float size.
#pragma once

#include <vector>

#include "../../attention/params.hpp"
#include "../../attention/validate.hpp"
#include "isa.hpp"

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

/// A contiguous BHSD double copy of a view (its shape; strides of its own).
/// An empty view stays empty with a non-null pointer (validate.hpp, settled).
template <class T>
TensorView<const double> widened(const TensorView<const T>& v, std::vector<double>& buf) {
  buf.assign(std::size_t(detail::element_count(v)), 0.0);
  TensorView<double> w = TensorView<double>::bhsd(buf.data(), v.batch, v.heads, v.seq, v.dim);
  if (!buf.empty())
    for (index_t b = 0; b < v.batch; ++b)
      for (index_t h = 0; h < v.heads; ++h)
        for (index_t s = 0; s < v.seq; ++s) {
          const T* src = v.row(b, h, s);
          double* dst = w.row(b, h, s);
          for (index_t d = 0; d < v.dim; ++d) dst[d] = double(src[d]);
        }
  detail::settle_if_empty(w);
  return w;
}

/// A zeroed contiguous double output of the shape of `v` (null when v is).
template <class T>
TensorView<double> widened_output(const TensorView<T>& v, std::vector<double>& buf) {
  if (v.data == nullptr) return {};
  buf.assign(std::size_t(detail::element_count(v)), 0.0);
  TensorView<double> w = TensorView<double>::bhsd(buf.data(), v.batch, v.heads, v.seq, v.dim);
  detail::settle_if_empty(w);
  return w;
}

/// Row `row` (id (b·Hq + h)·Lq + i) of a double output into the float view.
inline void narrow_row(const TensorView<double>& w, const TensorView<float>& v, index_t row) {
  if (v.data == nullptr || v.dim == 0) return;
  const index_t i = row % v.seq, h = (row / v.seq) % v.heads, b = row / (v.seq * v.heads);
  const double* src = w.row(b, h, i);
  float* dst = v.row(b, h, i);
  for (index_t d = 0; d < v.dim; ++d) dst[d] = float(src[d]);
}

/// The temperature in double (its array copied).
inline Temperature<double> widened(const Temperature<float>& t, const AttentionShape& s, std::vector<double>& buf) {
  Temperature<double> w;
  w.shape = t.shape;
  w.value = double(t.value);
  if (t.shape != TemperatureShape::scalar) {
    buf.assign(t.data, t.data + detail::temperature_count(t, s));
    w.data = buf.data();
  }
  return w;
}

/// What forward and backward arguments share, in double: Q, K, V (copied
/// into q, k, v), the temperature (its array into tau) and the options.
template <class Args, class WideArgs>
void widen_shared(const Args& a, const AttentionShape& s, WideArgs& w, std::vector<double>& q,
                  std::vector<double>& k, std::vector<double>& v, std::vector<double>& tau) {
  w.query = widened(a.query, q);
  w.key = widened(a.key, k);
  w.value = widened(a.value, v);
  w.kernel = a.kernel;
  w.temperature = widened(a.temperature, s, tau);
  w.scale = a.scale;
  w.visibility = a.visibility;
  w.compute = Compute::automatic;
  w.num_threads = a.num_threads;
}

/// Forward arguments of float storage in double. P and π are not carried
/// (the caller computes inspection outputs with the row-exact kernel).
struct WideForward {
  std::vector<double> q, k, v, o, lse, tau;
  ForwardArgs<double> args;
  WideForward(const ForwardArgs<float>& a, const AttentionShape& s) {
    widen_shared(a, s, args, q, k, v, tau);
    args.out = widened_output(a.out, o);
    if (a.lse) {
      lse.assign(std::size_t(s.rows()), 0.0);
      args.lse = lse.data();
    }
  }
  /// Rounds row `row`'s out and lse into the caller's arguments.
  void narrow(const ForwardArgs<float>& a, index_t row) const {
    narrow_row(args.out, a.out, row);
    if (a.lse) a.lse[row] = float(lse[std::size_t(row)]);
  }
};

/// Backward arguments of float storage in double (`out` is not carried: the
/// CPU backward does not read it).
struct WideBackward {
  std::vector<double> q, k, v, go, gq, gk, gv, gt, tau;
  BackwardArgs<double> args;
  WideBackward(const BackwardArgs<float>& a, const AttentionShape& s) {
    widen_shared(a, s, args, q, k, v, tau);
    args.grad_out = widened(a.grad_out, go);
    args.grad_query = widened_output(a.grad_query, gq);
    args.grad_key = widened_output(a.grad_key, gk);
    args.grad_value = widened_output(a.grad_value, gv);
    if (a.grad_temperature) {  // only asks for the per-row dτ terms (the caller writes dτ)
      gt.assign(std::size_t(detail::temperature_count(a.temperature, s)), 0.0);
      args.grad_temperature = gt.data();
    }
  }
};

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
