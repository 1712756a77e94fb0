// attention.hpp — the one place the model calls the attention operator.
// TEMPORARY: a tiny naive implementation behind the library's signature until
// the operator lands (branch `op`); then this forwards to
// continuum::attention_forward / attention_backward(continuum::cpu, ...).
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include <continuum/attention/params.hpp>
#include <continuum/math/density.hpp>

namespace lm {

namespace naive {

template <class T>
T row_scale(const continuum::Temperature<T>& t, std::int64_t b, std::int64_t h,
            std::int64_t i, std::int64_t H, std::int64_t L, double scale) {
  using continuum::TemperatureShape;
  T tau = t.shape == TemperatureShape::scalar   ? t.value
          : t.shape == TemperatureShape::per_head ? t.data[h]
                                                  : t.data[(b * H + h) * L + i];
  return T(scale) / tau;
}

template <class Stencil, class T>
void alphas(const std::vector<T>& s, std::int64_t lo, std::int64_t hi, std::vector<T>& a) {
  for (std::int64_t j = lo; j < hi; ++j) {
    const T left = j - 1 >= lo ? s[j - 1] : T(0);
    const T right = j + 1 < hi ? s[j + 1] : T(0);
    a[j] = Stencil::weight(left, s[j], right, j - 1 >= lo, j + 1 < hi);
  }
}

template <class Stencil, class T>
void forward(const continuum::ForwardArgs<T>& A) {
  const auto &Q = A.query, &K = A.key, &V = A.value;
  const auto B = Q.batch, H = Q.heads, Lq = Q.seq, Lk = K.seq, D = Q.dim, Dv = V.dim;
  const double scale = A.scale ? *A.scale : 1.0 / std::sqrt(double(D));
  std::vector<T> s(Lk), a(Lk);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Lq; ++i) {
        const std::int64_t hi = A.visibility.causal ? std::min(Lk, i + Lk - Lq + 1) : Lk;
        const std::int64_t lo = 0;
        const T c = row_scale(A.temperature, b, h, i, H, Lq, scale);
        T* o = A.out.row(b, h, i);
        const T* q = Q.row(b, h, i);
        T m = -std::numeric_limits<T>::infinity();
        for (std::int64_t j = lo; j < hi; ++j) {
          const T* k = K.row(b, h, j);
          T dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
          s[j] = c * dot;
          m = std::max(m, s[j]);
        }
        for (std::int64_t j = lo; j < hi; ++j) s[j] -= m;
        alphas<Stencil>(s, lo, hi, a);
        T Z = 0;
        for (std::int64_t j = lo; j < hi; ++j) Z += a[j];
        for (std::int64_t d = 0; d < Dv; ++d) o[d] = 0;
        for (std::int64_t j = lo; j < hi; ++j) {
          const T p = a[j] / Z;
          const T* v = V.row(b, h, j);
          for (std::int64_t d = 0; d < Dv; ++d) o[d] += p * v[d];
          const std::int64_t at = ((b * H + h) * Lq + i) * Lk + j;
          if (A.probs) A.probs[at] = p;
        }
        if (A.cell_mass) {
          for (std::int64_t j = 0; j < Lk; ++j) A.cell_mass[((b * H + h) * Lq + i) * Lk + j] = 0;
          for (std::int64_t j = lo; j < hi; ++j) {
            const T left = j - 1 >= lo ? s[j - 1] : T(0);
            const T right = j + 1 < hi ? s[j + 1] : T(0);
            A.cell_mass[((b * H + h) * Lq + i) * Lk + j] =
                Stencil::cell_mass(left, s[j], right, j - 1 >= lo, j + 1 < hi) / Z;
          }
        }
        if (A.lse) A.lse[(b * H + h) * Lq + i] = m + std::log(Z);
      }
}

template <class Stencil, class T>
void backward(const continuum::BackwardArgs<T>& A) {
  const auto &Q = A.query, &K = A.key, &V = A.value;
  const auto B = Q.batch, H = Q.heads, Lq = Q.seq, Lk = K.seq, D = Q.dim, Dv = V.dim;
  const double scale = A.scale ? *A.scale : 1.0 / std::sqrt(double(D));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t j = 0; j < Lk; ++j) {
        for (std::int64_t d = 0; d < D; ++d) A.grad_key.row(b, h, j)[d] = 0;
        for (std::int64_t d = 0; d < Dv; ++d) A.grad_value.row(b, h, j)[d] = 0;
      }
    }
  if (A.grad_temperature) {
    std::int64_t n = A.temperature.shape == continuum::TemperatureShape::scalar ? 1
                     : A.temperature.shape == continuum::TemperatureShape::per_head
                         ? H
                         : B * H * Lq;
    for (std::int64_t k = 0; k < n; ++k) A.grad_temperature[k] = 0;
  }
  std::vector<T> s(Lk), a(Lk), da(Lk), ds(Lk);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Lq; ++i) {
        const std::int64_t hi = A.visibility.causal ? std::min(Lk, i + Lk - Lq + 1) : Lk;
        const std::int64_t lo = 0;
        const T c = row_scale(A.temperature, b, h, i, H, Lq, scale);
        const T* q = Q.row(b, h, i);
        const T* o = A.out.row(b, h, i);
        const T* dO = A.grad_out.row(b, h, i);
        T* dq = A.grad_query.row(b, h, i);
        for (std::int64_t d = 0; d < D; ++d) dq[d] = 0;
        if (hi <= lo) continue;
        T m = -std::numeric_limits<T>::infinity();
        for (std::int64_t j = lo; j < hi; ++j) {
          const T* k = K.row(b, h, j);
          T dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
          s[j] = c * dot;
          m = std::max(m, s[j]);
        }
        std::vector<T> sh(s);
        for (std::int64_t j = lo; j < hi; ++j) sh[j] -= m;
        alphas<Stencil>(sh, lo, hi, a);
        T Z = 0;
        for (std::int64_t j = lo; j < hi; ++j) Z += a[j];
        T Dl = 0;
        for (std::int64_t d = 0; d < Dv; ++d) Dl += dO[d] * o[d];
        for (std::int64_t j = lo; j < hi; ++j) {
          const T* v = V.row(b, h, j);
          T dp = 0;
          for (std::int64_t d = 0; d < Dv; ++d) dp += dO[d] * v[d];
          da[j] = (dp - Dl) / Z;
          T* dv = A.grad_value.row(b, h, j);
          for (std::int64_t d = 0; d < Dv; ++d) dv[d] += a[j] / Z * dO[d];
        }
        T dtau = 0;
        for (std::int64_t j = lo; j < hi; ++j) {
          const bool hl = j - 1 >= lo, hr = j + 1 < hi;
          const T left = hl ? sh[j - 1] : T(0), right = hr ? sh[j + 1] : T(0);
          T g = da[j] * Stencil::weight_ds(left, sh[j], right, hl, hr);
          if (hl) g += da[j - 1] * Stencil::coupling(sh[j - 1], sh[j]);
          if (hr) g += da[j + 1] * Stencil::coupling(sh[j + 1], sh[j]);
          ds[j] = g;
          dtau += g * s[j];
          const T* k = K.row(b, h, j);
          T* dk = A.grad_key.row(b, h, j);
          for (std::int64_t d = 0; d < D; ++d) {
            dq[d] += c * g * k[d];
            dk[d] += c * g * q[d];
          }
        }
        if (A.grad_temperature) {
          const T tau = T(scale) / c;
          const T gt = -dtau / tau;
          using continuum::TemperatureShape;
          if (A.temperature.shape == TemperatureShape::scalar) A.grad_temperature[0] += gt;
          else if (A.temperature.shape == TemperatureShape::per_head) A.grad_temperature[h] += gt;
          else A.grad_temperature[(b * H + h) * Lq + i] += gt;
        }
      }
}

}  // namespace naive

template <class T>
void attention_forward(const continuum::ForwardArgs<T>& a) {
  if (a.kernel == continuum::Kernel::continuum)
    naive::forward<continuum::ContinuumStencil>(a);
  else
    naive::forward<continuum::SoftmaxStencil>(a);
}

template <class T>
void attention_backward(const continuum::BackwardArgs<T>& a) {
  if (a.kernel == continuum::Kernel::continuum)
    naive::backward<continuum::ContinuumStencil>(a);
  else
    naive::backward<continuum::SoftmaxStencil>(a);
}

}  // namespace lm
