// backends/cuda/arguments.cuh — host-side checks of the CUDA backend's
// arguments and their translation into the kernels' KernelParams. Only shapes
// and host-resident scalars are checked: the views hold device pointers, which
// are never dereferenced on the host.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>

#include "common.cuh"

namespace continuum {
namespace cuda_detail {

/// The largest head dimension the kernels accept (the tiles live in shared memory).
inline constexpr index_t max_head_dim = 256;

[[noreturn]] inline void bad(const std::string& what) {
  throw std::invalid_argument("continuum::attention (cuda): " + what);
}

/// Shape checks on the host (nothing is read from device memory).
template <class E>
void check_views(const TensorView<const E>& q, const TensorView<const E>& k,
                 const TensorView<const E>& v) {
  if (q.batch < 0 || q.heads < 0 || q.seq < 0 || q.dim < 0 || k.seq < 0 || v.dim < 0)
    bad("negative extent");
  if (k.batch != q.batch || v.batch != q.batch)
    bad("key/value batch must equal query batch " + std::to_string(q.batch));
  if (k.dim != q.dim) bad("key dim must equal query dim " + std::to_string(q.dim));
  if (v.heads != k.heads || v.seq != k.seq) bad("value must be [B, Hk, Lk, Dv] like key");
  if (k.heads <= 0 && q.heads > 0) bad("key heads must be >= 1");
  if (q.heads > 0 && q.heads % k.heads != 0)
    bad("query heads " + std::to_string(q.heads) + " must be a multiple of key heads " +
        std::to_string(k.heads) + " (GQA)");
  if (q.dim > max_head_dim || v.dim > max_head_dim)
    bad("head_dim and value dim must be <= " + std::to_string(max_head_dim));
}

template <class E, class T>
void check_out(const TensorView<T>& o, index_t B, index_t H, index_t L, index_t Dv,
               const char* name) {
  if (o.batch != B || o.heads != H || o.seq != L || o.dim != Dv)
    bad(std::string(name) + " must be [" + std::to_string(B) + ", " + std::to_string(H) + ", " +
        std::to_string(L) + ", " + std::to_string(Dv) + "]");
}

template <class E, class A, class Args>
KernelParams<E, A> make_params(const Args& a) {
  KernelParams<E, A> p;
  p.q = a.query;
  p.k = a.key;
  p.v = a.value;
  p.B = a.query.batch;
  p.Hq = a.query.heads;
  p.Hk = a.key.heads;
  p.Lq = a.query.seq;
  p.Lk = a.key.seq;
  p.D = a.query.dim;
  p.Dv = a.value.dim;
  const double scale = a.scale.value_or(p.D > 0 ? 1.0 / std::sqrt(double(p.D)) : 1.0);
  if (!(scale > 0) || !std::isfinite(scale)) bad("scale must be finite and > 0");
  p.scale = A(scale);
  p.tshape = a.temperature.shape;
  p.tvalue = a.temperature.value;
  p.tdata = a.temperature.data;
  if (p.tshape == TemperatureShape::scalar && !(double(p.tvalue) > 0))
    bad("temperature must be > 0, got " + std::to_string(double(p.tvalue)));
  if (p.tshape != TemperatureShape::scalar && p.tdata == nullptr)
    bad("temperature.data must be set for per-head / per-query temperature");
  p.causal = a.visibility.causal;
  p.window = a.visibility.window;
  if (p.window < 0) bad("window must be >= 0");
  p.range_lo = a.visibility.range_lo;
  p.range_hi = a.visibility.range_hi;
  return p;
}

}  // namespace cuda_detail
}  // namespace continuum
