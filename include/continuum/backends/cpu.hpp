// backends/cpu.hpp — the CPU backend: attention_impl<cpu_t> (STYLE.md,
// "Backend selection at compile time").
//
// Every call runs the tiled kernels (cpu/tiled.hpp) in the arithmetic that
// args.compute selects (params.hpp, Compute):
//   float storage, float compute (the default): tiled in float; the rows whose
//     visible data float cannot hold go to the same kernels in double
//     (cpu/widen.hpp), computed on those rows only;
//   float storage, float64 compute: the whole call converted to double, tiled
//     in double, each output rounded once;
//   double storage: tiled in double.
// What the tiled kernels in double decline (non-finite visible data, raw
// scores beyond DBL_MAX, sums of values near DBL_MAX: MATH.md §10, appendix A
// W13) and the inspection outputs P and π are computed by the row-exact
// kernels (cpu/forward.hpp, cpu/backward.hpp), row by row.
#pragma once

#include <type_traits>
#include <vector>

#include "backend.hpp"
#include "cpu/backward.hpp"
#include "cpu/tiled.hpp"
#include "cpu/forward.hpp"
#include "cpu/widen.hpp"
#include "cpu/isa.hpp"
#if defined(CONTINUUM_CPU_DISPATCH)
#  include "cpu/dispatch.hpp"
#endif

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
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
    f.temperature.value = tiled::temperature_of(a.temperature, r.b, r.h, r.i, a.query.heads, a.query.seq);
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
    g.temperature.value = tiled::temperature_of(a.temperature, r.b, r.h, r.i, a.query.heads, a.query.seq);
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


/// Row-id mask of `rows` (1 = in the subset) for a call of `n` rows.
inline std::vector<char> subset_of(const std::vector<index_t>& rows, index_t n) {
  std::vector<char> m(std::size_t(n), 0);
  for (index_t r : rows) m[std::size_t(r)] = 1;
  return m;
}

/// Float storage in double: the rows `rows` (null = every row) of the call,
/// tiled in double, rows declined there by the row-exact kernel; their out and
/// lse rounded once into the caller's arguments.
template <class Stencil>
void forward_in_double(const ForwardArgs<float>& a, const AttentionShape& sh, double scale,
                       const std::vector<index_t>* rows) {
  constexpr bool kContinuum = std::is_same<Stencil, ContinuumStencil>::value;
  const WideForward w(a, sh);
  const std::vector<char> subset = rows ? subset_of(*rows, sh.rows()) : std::vector<char>();
  tiled::forward_tiled<double, kContinuum>(w.args, scale, rows ? subset.data() : nullptr,
                                           [&](const std::vector<index_t>& declined) {
                                             exact_forward_rows<double, Stencil>(w.args, scale, declined);
                                           });
  if (rows)
    for (index_t r : *rows) w.narrow(a, r);
  else
    for (index_t r = 0; r < sh.rows(); ++r) w.narrow(a, r);
}

/// The backward counterpart. With `rows` (float rows declined by the float
/// pass): writes their dQ, adds their dK, dV terms to the float pass's and sets
/// their entries of dtau_rows. Without: the whole call, every output written.
template <class Stencil>
void backward_in_double(const BackwardArgs<float>& a, const AttentionShape& sh, double scale,
                        const std::vector<index_t>* rows, std::vector<double>& dtau_rows) {
  constexpr bool kContinuum = std::is_same<Stencil, ContinuumStencil>::value;
  const WideBackward w(a, sh);
  const std::vector<char> subset = rows ? subset_of(*rows, sh.rows()) : std::vector<char>();
  const std::vector<double> dtau = tiled::backward_tiled<double, kContinuum>(
      w.args, scale, rows ? subset.data() : nullptr,
      [&](const std::vector<index_t>& declined, std::vector<double>& dt) {
        exact_backward_rows<double, Stencil>(w.args, scale, declined, dt);
      });
  auto each_element = [](const TensorView<float>& v, const TensorView<double>& wv, auto&& f) {
    if (v.data == nullptr || wv.data == nullptr) return;
    for (index_t b = 0; b < v.batch; ++b)
      for (index_t h = 0; h < v.heads; ++h)
        for (index_t s = 0; s < v.seq; ++s) {
          float* o = v.row(b, h, s);
          const double* x = wv.row(b, h, s);
          for (index_t d = 0; d < v.dim; ++d) f(o[d], x[d]);
        }
  };
  const auto assign = [](float& o, double x) { o = float(x); };
  const auto add = [](float& o, double x) { o = float(double(o) + x); };
  if (rows) {
    for (index_t r : *rows) {
      narrow_row(w.args.grad_query, a.grad_query, r);
      if (a.grad_temperature) dtau_rows[std::size_t(r)] = dtau[std::size_t(r)];
    }
    each_element(a.grad_key, w.args.grad_key, add);
    each_element(a.grad_value, w.args.grad_value, add);
  } else {
    each_element(a.grad_query, w.args.grad_query, assign);
    each_element(a.grad_key, w.args.grad_key, assign);
    each_element(a.grad_value, w.args.grad_value, assign);
    dtau_rows = dtau;
  }
}

/// The CPU forward of one validated call (attention_impl<cpu_t>::forward),
/// compiled for this translation unit's instruction set (isa.hpp).
template <class T, class Stencil>
void run_forward(const ForwardArgs<T>& args, const AttentionShape& shape, double scale) {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "continuum CPU backend: T must be float or double");
  constexpr bool kContinuum = std::is_same<Stencil, ContinuumStencil>::value;
  if (args.probs != nullptr || args.cell_mass != nullptr) {
    // Inspection outputs (small inputs): the row-exact kernel, in double.
    forward<T, Stencil>(args, shape, scale);
    return;
  }
  if constexpr (std::is_same<T, float>::value) {
    if (args.compute == Compute::float64) {
      forward_in_double<Stencil>(args, shape, scale, nullptr);
      return;
    }
    tiled::forward_tiled<float, kContinuum>(args, scale, nullptr, [&](const std::vector<index_t>& rows) {
      forward_in_double<Stencil>(args, shape, scale, &rows);
    });
  } else {
    tiled::forward_tiled<double, kContinuum>(args, scale, nullptr, [&](const std::vector<index_t>& rows) {
      exact_forward_rows<double, Stencil>(args, scale, rows);
    });
  }
}

/// The CPU backward of one validated call (attention_impl<cpu_t>::backward).
template <class T, class Stencil>
void run_backward(const BackwardArgs<T>& args, const AttentionShape& shape, double scale) {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "continuum CPU backend: T must be float or double");
  constexpr bool kContinuum = std::is_same<Stencil, ContinuumStencil>::value;
  std::vector<double> dtau_rows;
  if constexpr (std::is_same<T, float>::value) {
    if (args.compute == Compute::float64) {
      backward_in_double<Stencil>(args, shape, scale, nullptr, dtau_rows);
    } else {
      dtau_rows = tiled::backward_tiled<float, kContinuum>(
          args, scale, nullptr, [&](const std::vector<index_t>& rows, std::vector<double>& dt) {
            backward_in_double<Stencil>(args, shape, scale, &rows, dt);
          });
    }
  } else {
    dtau_rows = tiled::backward_tiled<double, kContinuum>(
        args, scale, nullptr, [&](const std::vector<index_t>& rows, std::vector<double>& dt) {
          exact_backward_rows<double, Stencil>(args, scale, rows, dt);
        });
  }
  if (args.grad_temperature) tiled::write_grad_temperature(args, dtau_rows);
}

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE

/// The CPU backend. Built with CONTINUUM_CPU_DISPATCH (the project's own
/// binaries: the CMake target continuum::cpu_dispatch), each call runs the
/// kernels compiled for the best instruction set the running CPU has
/// (cpu/dispatch.hpp); otherwise the kernels of this translation unit's
/// target (-march), inline.
template <>
struct attention_impl<cpu_t> {
  template <class T, class Stencil>
  static void forward(const ForwardArgs<T>& args, const AttentionShape& shape, double scale) {
#if defined(CONTINUUM_CPU_DISPATCH)
    cpu_dispatch::forward(args, shape, scale, Stencil{});
#else
    cpu_detail::run_forward<T, Stencil>(args, shape, scale);
#endif
  }
  template <class T, class Stencil>
  static void backward(const BackwardArgs<T>& args, const AttentionShape& shape, double scale) {
#if defined(CONTINUUM_CPU_DISPATCH)
    cpu_dispatch::backward(args, shape, scale, Stencil{});
#else
    cpu_detail::run_backward<T, Stencil>(args, shape, scale);
#endif
  }
};

}  // namespace continuum
