// backends/cuda/arguments.cuh — host-side checks of the CUDA backend's
// arguments (attention/validate.hpp's checks, minus those that would read
// device memory) and their translation into the kernels' KernelParams.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>

#include "../../attention/validate.hpp"
#include "common.cuh"

namespace continuum {
namespace cuda_detail {

/// The largest head dimension the kernels accept (the tiles live in shared memory).
inline constexpr index_t max_head_dim = 256;

/// The checks of validate.hpp that need no device memory: shapes, strides,
/// aliasing (pointer arithmetic only), kernel, scale, a scalar temperature,
/// window, ranges given both-or-neither. Per-head / per-query temperatures and
/// explicit ranges are device arrays and are not read (their values are the
/// caller's responsibility). Also head_dim, value dim ≤ 256.
inline void check_cuda_limits(const char* fn, const AttentionShape& s) {
  if (s.dim > max_head_dim || s.dim_v > max_head_dim)
    detail::fail(fn, "head_dim and value dim must be <= " + std::to_string(max_head_dim) +
                         " on the CUDA backend, got D = " + std::to_string(s.dim) +
                         ", Dv = " + std::to_string(s.dim_v));
}

template <class T>
void check_device_temperature(const char* fn, const Temperature<T>& t, const AttentionShape& s,
                              double scale) {
  if (t.shape == TemperatureShape::scalar) {
    detail::check_temperature(fn, t, s, scale);
  } else if (t.data == nullptr && s.batch * s.heads_q * s.len_q > 0) {
    detail::fail(fn, "temperature: per_head / per_query need data (a device array), got null");
  }
}

inline void check_device_visibility(const char* fn, const Visibility& v) {
  if (v.window < 0) detail::fail(fn, "visibility.window: must be >= 0, got " + std::to_string(v.window));
  if ((v.range_lo == nullptr) != (v.range_hi == nullptr))
    detail::fail(fn, "visibility.range_lo / range_hi: give both or neither");
}

template <class T>
AttentionShape validate_forward_device(const ForwardArgs<T>& a, double* scale_out) {
  const char* fn = "attention_forward(cuda)";
  const AttentionShape s = detail::resolve_shape<T>(fn, a.query, a.key, a.value);
  detail::check_view(fn, "out", a.out, s.batch, s.heads_q, s.len_q, s.dim_v, "[B, Hq, Lq, Dv]", true);
  const index_t rows = s.batch * s.heads_q * s.len_q;
  const detail::Span in[] = {detail::span_of(a.query), detail::span_of(a.key), detail::span_of(a.value)};
  const detail::Span outs[] = {detail::span_of(a.out), detail::span_of(a.lse, rows)};
  for (const auto& o : outs)
    for (const auto& i : in)
      if (detail::overlap(o, i)) detail::fail(fn, "out / lse: aliases an input (query/key/value)");
  if (detail::overlap(outs[0], outs[1])) detail::fail(fn, "lse: aliases out");
  if (a.probs != nullptr || a.cell_mass != nullptr)
    detail::fail(fn, "probs / cell_mass: inspection outputs are CPU-only, pass null");
  if (a.kernel != Kernel::continuum && a.kernel != Kernel::softmax && a.kernel != Kernel::focal)
    detail::fail(fn, "kernel: unknown value");
  check_cuda_limits(fn, s);
  const double scale = detail::check_scale(fn, a.scale, s.dim);
  check_device_temperature(fn, a.temperature, s, scale);
  check_device_visibility(fn, a.visibility);
  *scale_out = scale;
  return s;
}

template <class T>
AttentionShape validate_backward_device(const BackwardArgs<T>& a, double* scale_out) {
  const char* fn = "attention_backward(cuda)";
  const AttentionShape s = detail::resolve_shape<T>(fn, a.query, a.key, a.value);
  detail::check_view(fn, "out", a.out, s.batch, s.heads_q, s.len_q, s.dim_v, "[B, Hq, Lq, Dv]", false);
  detail::check_view(fn, "grad_out", a.grad_out, s.batch, s.heads_q, s.len_q, s.dim_v, "[B, Hq, Lq, Dv]", false);
  if (a.grad_query.data)
    detail::check_view(fn, "grad_query", a.grad_query, s.batch, s.heads_q, s.len_q, s.dim, "[B, Hq, Lq, D]", true);
  if (a.grad_key.data)
    detail::check_view(fn, "grad_key", a.grad_key, s.batch, s.heads_kv, s.len_k, s.dim, "[B, Hk, Lk, D]", true);
  if (a.grad_value.data)
    detail::check_view(fn, "grad_value", a.grad_value, s.batch, s.heads_kv, s.len_k, s.dim_v, "[B, Hk, Lk, Dv]", true);
  const index_t rows = s.batch * s.heads_q * s.len_q;
  if (a.lse == nullptr && rows > 0) detail::fail(fn, "lse: required (from attention_forward), got null");
  const detail::Span in[] = {detail::span_of(a.query), detail::span_of(a.key), detail::span_of(a.value),
                             detail::span_of(a.out), detail::span_of(a.grad_out), detail::span_of(a.lse, rows)};
  const detail::Span outs[] = {detail::span_of(a.grad_query), detail::span_of(a.grad_key),
                               detail::span_of(a.grad_value)};
  for (int o = 0; o < 3; ++o) {
    for (const auto& i : in)
      if (detail::overlap(outs[o], i)) detail::fail(fn, "grad_query/grad_key/grad_value: aliases an input");
    for (int q = 0; q < o; ++q)
      if (detail::overlap(outs[o], outs[q])) detail::fail(fn, "gradient outputs alias each other");
  }
  if (a.kernel != Kernel::continuum && a.kernel != Kernel::softmax && a.kernel != Kernel::focal)
    detail::fail(fn, "kernel: unknown value");
  check_cuda_limits(fn, s);
  const double scale = detail::check_scale(fn, a.scale, s.dim);
  check_device_temperature(fn, a.temperature, s, scale);
  check_device_visibility(fn, a.visibility);
  *scale_out = scale;
  return s;
}

/// The kernels' parameter block from validated arguments.
template <class E, class A, class Args>
KernelParams<E, A> make_params(const Args& a, const AttentionShape& s, double scale) {
  KernelParams<E, A> p;
  p.q = a.query;
  p.k = a.key;
  p.v = a.value;
  p.B = s.batch;
  p.Hq = s.heads_q;
  p.Hk = s.heads_kv;
  p.Lq = s.len_q;
  p.Lk = s.len_k;
  p.D = s.dim;
  p.Dv = s.dim_v;
  p.scale = A(scale);
  p.tshape = a.temperature.shape;
  p.tvalue = a.temperature.value;
  p.tdata = a.temperature.data;
  p.vis = a.visibility;
  return p;
}

}  // namespace cuda_detail
}  // namespace continuum
