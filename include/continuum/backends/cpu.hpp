// backends/cpu.hpp — the CPU backend: attention_impl<cpu_t> (STYLE.md,
// "Backend selection at compile time").
#pragma once

#include <type_traits>
#include <vector>

#include "backend.hpp"
#include "cpu/backward.hpp"
#include "cpu/flash.hpp"
#include "cpu/forward.hpp"

namespace continuum {
namespace cpu_detail {

/// One query row (b, h, i) of a call as a call of its own: batch = heads =
/// Lq = 1, the key/value head it reads, its visible range as an explicit range
/// (lohi[0], lohi[1]) and its temperature as a scalar. The exact kernels give
/// it the same operations as in the full call (absolute key tiles).
struct OneRow {
  index_t b, h, i, hk;
  index_t lohi[2];
};
template <class T>
inline OneRow one_row(const TensorView<const T>& query, const TensorView<const T>& key, const Visibility& vis,
                      index_t row) {
  const index_t Hq = query.heads, Lq = query.seq;
  OneRow r;
  r.i = row % Lq;
  r.h = (row / Lq) % Hq;
  r.b = row / (Lq * Hq);
  r.hk = r.h / (Hq / key.heads);
  const KeyRange rg = visible_range(vis, r.b, r.i, Lq, key.seq);
  r.lohi[0] = rg.lo;
  r.lohi[1] = rg.hi;
  return r;
}
template <class T>
inline TensorView<T> row_view(const TensorView<T>& v, index_t b, index_t h, index_t s) {
  return {v.data ? v.row(b, h, s) : nullptr, 1, 1, 1, v.dim, 0, 0, v.dim, 1};
}
template <class T>
inline TensorView<T> head_view(const TensorView<T>& v, index_t b, index_t h) {
  return {v.data ? v.row(b, h, 0) : nullptr, 1, 1, v.seq, v.dim, 0, 0, v.stride_seq, 1};
}

/// The exact forward on the given rows only (rows the tiled kernel declined).
template <class T, class Stencil>
void exact_forward_rows(const ForwardArgs<T>& a, double scale, const std::vector<index_t>& rows) {
  const index_t Lk = a.key.seq;
  for (index_t row : rows) {
    OneRow r = one_row(a.query, a.key, a.visibility, row);
    ForwardArgs<T> f;
    f.query = row_view(a.query, r.b, r.h, r.i);
    f.key = head_view(a.key, r.b, r.hk);
    f.value = head_view(a.value, r.b, r.hk);
    f.out = row_view(a.out, r.b, r.h, r.i);
    f.lse = a.lse ? a.lse + row : nullptr;
    f.kernel = a.kernel;
    f.temperature.value = flash::temperature_of(a.temperature, r.b, r.h, r.i, a.query.heads, a.query.seq);
    f.visibility.range_lo = &r.lohi[0];
    f.visibility.range_hi = &r.lohi[1];
    f.num_threads = 1;
    const AttentionShape sh{1, 1, 1, 1, Lk, a.query.dim, a.value.dim};
    forward<T, Stencil>(f, sh, scale);
  }
}

/// The exact backward on the given rows only: writes their dQ, adds their
/// dK, dV terms (in row order, after the tiled pass) and sets their dτ terms.
template <class T, class Stencil>
void exact_backward_rows(const BackwardArgs<T>& a, double scale, const std::vector<index_t>& rows,
                         std::vector<double>& dtau_rows) {
  const index_t Lk = a.key.seq, D = a.query.dim, Dv = a.value.dim;
  std::vector<T> dk(a.grad_key.data ? std::size_t(Lk * D) : 0), dv(a.grad_value.data ? std::size_t(Lk * Dv) : 0);
  for (index_t row : rows) {
    OneRow r = one_row(a.query, a.key, a.visibility, row);
    BackwardArgs<T> g;
    g.query = row_view(a.query, r.b, r.h, r.i);
    g.key = head_view(a.key, r.b, r.hk);
    g.value = head_view(a.value, r.b, r.hk);
    g.out = row_view(a.out, r.b, r.h, r.i);
    g.grad_out = row_view(a.grad_out, r.b, r.h, r.i);
    g.grad_query = row_view(a.grad_query, r.b, r.h, r.i);
    g.grad_key = {a.grad_key.data ? dk.data() : nullptr, 1, 1, Lk, D, 0, 0, D, 1};
    g.grad_value = {a.grad_value.data ? dv.data() : nullptr, 1, 1, Lk, Dv, 0, 0, Dv, 1};
    T dtau = T(0);
    g.grad_temperature = a.grad_temperature ? &dtau : nullptr;
    g.kernel = a.kernel;
    g.temperature.value = flash::temperature_of(a.temperature, r.b, r.h, r.i, a.query.heads, a.query.seq);
    g.visibility.range_lo = &r.lohi[0];
    g.visibility.range_hi = &r.lohi[1];
    g.num_threads = 1;
    const AttentionShape sh{1, 1, 1, 1, Lk, D, Dv};
    backward<T, Stencil>(g, sh, scale);
    for (index_t j = r.lohi[0]; j < r.lohi[1]; ++j) {
      if (a.grad_key.data) {
        T* o = a.grad_key.row(r.b, r.hk, j);
        for (index_t d = 0; d < D; ++d) o[d] += dk[std::size_t(j * D + d)];
      }
      if (a.grad_value.data) {
        T* o = a.grad_value.row(r.b, r.hk, j);
        for (index_t d = 0; d < Dv; ++d) o[d] += dv[std::size_t(j * Dv + d)];
      }
    }
    if (a.grad_temperature) dtau_rows[std::size_t(row)] = double(dtau);
  }
}

}  // namespace cpu_detail

template <>
struct attention_impl<cpu_t> {
  template <class T, class Stencil>
  static void forward(const ForwardArgs<T>& args, const AttentionShape& shape, double scale) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                  "continuum CPU backend: T must be float or double");
    // The tiled kernels (cpu/flash.hpp) only when the caller opts in with
    // float_arithmetic; rows whose visible inputs they do not suit go to the
    // exact kernels one by one (all of them: the whole call). By default the
    // exact double-accumulating kernels, which every reference test exercises.
    constexpr bool kContinuum = std::is_same<Stencil, ContinuumStencil>::value;
    if (args.float_arithmetic &&
        cpu_detail::flash::flash_forward<T, kContinuum>(args, scale, [&](const std::vector<index_t>& rows) {
          cpu_detail::exact_forward_rows<T, Stencil>(args, scale, rows);
        }))
      return;
    cpu_detail::forward<T, Stencil>(args, shape, scale);
  }
  template <class T, class Stencil>
  static void backward(const BackwardArgs<T>& args, const AttentionShape& shape, double scale) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                  "continuum CPU backend: T must be float or double");
    constexpr bool kContinuum = std::is_same<Stencil, ContinuumStencil>::value;
    if (args.float_arithmetic &&
        cpu_detail::flash::flash_backward<T, kContinuum>(
            args, scale, [&](const std::vector<index_t>& rows, std::vector<double>& dtau_rows) {
              cpu_detail::exact_backward_rows<T, Stencil>(args, scale, rows, dtau_rows);
            }))
      return;
    cpu_detail::backward<T, Stencil>(args, shape, scale);
  }
};

}  // namespace continuum
