// backends/cuda/arguments.cuh — host-side checks of the CUDA backend's
// arguments (attention/validate.hpp's checks, minus those that would read
// device memory) and their translation into the kernels' KernelParams.
#pragma once

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "../../attention/validate.hpp"
#include "common.cuh"

namespace continuum {
namespace cuda_detail {

/// The largest head dimension the kernels accept (the tiles live in shared memory).
inline constexpr index_t max_head_dim = 256;

/// validate.hpp's checks, with the kernels' properties: c = scale / τ is
/// formed in the accumulator type, and the values of the device arrays
/// (per-head / per-query temperature, explicit ranges) are checked on the
/// device (device_array_check_body below); their sizes and aliasing are
/// checked here, from the pointers alone. Also head_dim, value dim <= 256 and
/// no probs / cell_mass; compute automatic or float32 (the kernels compute in float).
template <class T>
ValidateOptions device_options(const char* fn, Compute compute) {
  // The CUDA kernels compute in float (accum_t<T>) only.
  if (compute == Compute::float64)
    detail::fail(fn, "compute: float64 is CPU-only (the CUDA backend computes in float); pass "
                     "Compute::automatic");
  if (compute != Compute::automatic && compute != Compute::float32)
    detail::fail(fn, "compute: not a Compute value (" + std::to_string(static_cast<int>(compute)) + ")");
  ValidateOptions opt;
  opt.fn = fn;
  opt.host_arrays = false;
  opt.fold_in_float = std::is_same<accum_t<T>, float>::value;
  return opt;
}

inline void check_cuda_limits(const char* fn, const AttentionShape& s) {
  if (s.dim > max_head_dim || s.dim_v > max_head_dim)
    detail::fail(fn, "head_dim and value dim must be <= " + std::to_string(max_head_dim) +
                         " on the CUDA backend, got D = " + std::to_string(s.dim) +
                         ", Dv = " + std::to_string(s.dim_v));
}

template <class T>
AttentionShape validate_forward_device(const ForwardArgs<T>& a, double* scale_out) {
  const char* fn = "attention_forward(cuda)";
  if (a.probs != nullptr || a.cell_mass != nullptr)
    detail::fail(fn, "probs / cell_mass: inspection outputs are CPU-only, pass null");
  if (a.row_stats.values != nullptr || a.row_stats.ref != nullptr)
    detail::fail(fn, "row_stats: the CPU backward's row statistics come from a CPU forward only, pass null");
  const AttentionShape s = validate_forward(a, scale_out, device_options<T>(fn, a.compute));
  check_cuda_limits(fn, s);
  return s;
}

template <class T>
AttentionShape validate_backward_device(const BackwardArgs<T>& a, double* scale_out) {
  const char* fn = "attention_backward(cuda)";
  const AttentionShape s = validate_backward(a, scale_out, device_options<T>(fn, a.compute));
  check_cuda_limits(fn, s);
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
  double scale = 1;      ///< the softmax scale
  double max_c = 0;      ///< the largest c = scale / τ allowed: A's largest value
  index_t count() const { return n_tau > n_range ? n_tau : n_range; }
};

template <class A, class Args>
DeviceArrays<A> device_arrays(const Args& a, const AttentionShape& s, double scale) {
  DeviceArrays<A> d;
  if (a.temperature.shape != TemperatureShape::scalar && a.temperature.data != nullptr) {
    d.tau = a.temperature.data;
    d.n_tau = detail::temperature_count(a.temperature, s);
  }
  if (a.visibility.range_lo != nullptr) {
    d.range_lo = a.visibility.range_lo;
    d.range_hi = a.visibility.range_hi;
    d.n_range = s.batch * s.len_q;
  }
  d.Lk = s.len_k;
  d.scale = scale;
  d.max_c = static_cast<double>(std::numeric_limits<A>::max());
  return d;
}

/// Device side of the value checks, with validate.hpp's conditions: τ finite
/// and > 0 with scale/τ (in double) at most A's largest value (check_temperature
/// with fold_in_float for A = float: the kernels form c = scale/τ in A), and
/// 0 <= lo <= hi <= Lk. Grid-stride over both
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
    bad_tau |= !(tau > A(0)) || !math::isfinite(tau) || !(d.scale / static_cast<double>(tau) <= d.max_c);
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
    detail::check_temperature(fn, th, s, scale, std::is_same<A, float>::value);
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
