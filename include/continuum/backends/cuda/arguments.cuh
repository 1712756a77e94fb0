// backends/cuda/arguments.cuh — host-side checks of the CUDA backend's
// arguments (attention/validate.hpp's checks, minus those that would read
// device memory) and their translation into the kernels' KernelParams.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../attention/validate.hpp"
#include "common.cuh"

namespace continuum {
namespace cuda_detail {

/// The largest head dimension the kernels accept (the tiles live in shared memory).
inline constexpr index_t max_head_dim = 256;

/// The checks of validate.hpp that need no device memory: shapes, strides,
/// aliasing (pointer arithmetic only), kernel, scale, a scalar temperature,
/// window, ranges given both-or-neither. Also head_dim, value dim ≤ 256. The
/// values of the device arrays (per-head / per-query temperature, explicit
/// ranges) are checked on the device: device_array_check_body below.
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
    // validate.hpp checks scale/τ in double; the kernels form c = scale/τ in T.
    if (!std::isfinite(static_cast<double>(T(scale) / t.value)))
      detail::fail(fn, "temperature: too small, scale / temperature = " + detail::num(scale) + " / " +
                           detail::num(static_cast<double>(t.value)) + " overflows the accumulator type");
  } else if (t.data == nullptr && s.batch * s.heads_q * s.len_q > 0) {
    detail::fail(fn, "temperature: per_head / per_query need data (a device array), got null");
  }
}

inline void check_device_visibility(const char* fn, const Visibility& v) {
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

/// The argument values that live in device memory: a per-head / per-query
/// temperature ([Hq] / [B, Hq, Lq]) and explicit ranges ([B, Lq] each).
template <class A>
struct DeviceArrays {
  const A* tau = nullptr;
  index_t n_tau = 0;
  const index_t* range_lo = nullptr;
  const index_t* range_hi = nullptr;
  index_t n_range = 0;
  index_t Lk = 0;
  A scale = A(1);
  index_t count() const { return n_tau > n_range ? n_tau : n_range; }
};

template <class A, class Args>
DeviceArrays<A> device_arrays(const Args& a, const AttentionShape& s, double scale) {
  DeviceArrays<A> d;
  if (a.temperature.shape != TemperatureShape::scalar && a.temperature.data != nullptr) {
    d.tau = a.temperature.data;
    d.n_tau = a.temperature.shape == TemperatureShape::per_head ? s.heads_q : s.batch * s.heads_q * s.len_q;
  }
  if (a.visibility.range_lo != nullptr) {
    d.range_lo = a.visibility.range_lo;
    d.range_hi = a.visibility.range_hi;
    d.n_range = s.batch * s.len_q;
  }
  d.Lk = s.len_k;
  d.scale = A(scale);
  return d;
}

/// Device side of the value checks, with validate.hpp's conditions: τ finite
/// and > 0 with scale/τ finite (here in the accumulator type A, in which the
/// kernels form c = scale/τ), and 0 <= lo <= hi <= Lk. Grid-stride over both
/// arrays; block x writes flags[2x] = 1 if it saw a bad τ and flags[2x + 1] = 1
/// for a bad range (0 otherwise): thread 0 ORs the block's values in a fixed
/// order, no atomics. Shared memory: 2·block_threads() ints.
template <class A>
CONTINUUM_DEVICE void device_array_check_body(const DeviceArrays<A>& d, int* flags) {
  const int tid = thread_id(), nt = block_threads();
  int* red = reinterpret_cast<int*>(shared_bytes());
  int bad_tau = 0, bad_range = 0;
  const index_t stride = grid_blocks() * nt;
  for (index_t x = block_id() * nt + tid; x < d.n_tau; x += stride) {
    const A tau = d.tau[x];
    bad_tau |= !(tau > A(0)) || !math::isfinite(tau) || !math::isfinite(d.scale / tau);
  }
  for (index_t x = block_id() * nt + tid; x < d.n_range; x += stride) {
    const index_t lo = d.range_lo[x], hi = d.range_hi[x];
    bad_range |= lo < 0 || hi > d.Lk || lo > hi;
  }
  red[tid] = bad_tau;
  red[nt + tid] = bad_range;
  block_sync();
  if (tid == 0) {
    int t = 0, r = 0;
    for (int x = 0; x < nt; ++x) {
      t |= red[x];
      r |= red[nt + x];
    }
    flags[2 * block_id()] = t;
    flags[2 * block_id() + 1] = r;
  }
}

/// Blocks of the check launch: enough for the arrays, at most 32 (the flags
/// come back to the host).
inline index_t device_check_blocks(index_t count, int threads) {
  const index_t n = (count + threads - 1) / threads;
  return n < 1 ? 1 : (n > 32 ? 32 : n);
}

/// Host side: `flags` as device_array_check_body wrote them (2 per block). On a
/// failure the offending array is copied to the host with
/// `fetch(host_dst, device_src, bytes)` and validate.hpp's own check names the
/// first bad element, so the message is the CPU backend's.
/// \throws std::invalid_argument on a bad τ or range.
template <class A, class Fetch>
void report_device_arrays(const char* fn, const std::vector<int>& flags, const Temperature<A>& t,
                          const Visibility& v, const AttentionShape& s, const DeviceArrays<A>& d,
                          double scale, Fetch fetch) {
  bool bad_tau = false, bad_range = false;
  for (std::size_t x = 0; x + 1 < flags.size(); x += 2) {
    bad_tau = bad_tau || flags[x] != 0;
    bad_range = bad_range || flags[x + 1] != 0;
  }
  if (bad_tau) {
    std::vector<A> host(static_cast<std::size_t>(d.n_tau));
    fetch(host.data(), d.tau, sizeof(A) * host.size());
    Temperature<A> th = t;
    th.data = host.data();
    detail::check_temperature(fn, th, s, scale);
    // validate.hpp checks scale/τ in double; the kernels form it in A.
    for (std::size_t x = 0; x < host.size(); ++x)
      if (!std::isfinite(static_cast<double>(A(scale) / host[x])))
        detail::fail(fn, "temperature[" + std::to_string(x) + "] (flat index): too small, scale / temperature = " +
                             detail::num(scale) + " / " + detail::num(static_cast<double>(host[x])) +
                             " overflows the accumulator type");
  }
  if (bad_range) {
    std::vector<index_t> lo(static_cast<std::size_t>(d.n_range)), hi(lo.size());
    fetch(lo.data(), d.range_lo, sizeof(index_t) * lo.size());
    fetch(hi.data(), d.range_hi, sizeof(index_t) * hi.size());
    Visibility vh = v;
    vh.range_lo = lo.data();
    vh.range_hi = hi.data();
    detail::check_visibility(fn, vh, s);
  }
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
