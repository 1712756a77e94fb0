// backends/cpu.hpp — the CPU backend: attention_impl<cpu_t>, chosen at compile
// time by the backend tag (backends/backend.hpp).
//
// Every call runs the one tiled kernel family (cpu/tiled.hpp) in the
// arithmetic that args.compute selects (params.hpp, Compute):
//   float storage, float compute (the default): the kernels in float; the rows
//     whose visible data float cannot hold go to the same kernels in double,
//     computed on those rows only (cpu/widen.hpp);
//   float storage, float64 compute: the whole call converted to double, the
//     kernels in double, each output rounded once;
//   double storage: the kernels in double;
//   16-bit storage, bfloat16 or float16 (cpu/storage16.hpp): the call
//     converted to float (or to double with Compute::float64) once — except
//     a float forward, which reads Q, K and V as stored, row by row and tile
//     by tile, and writes each output row where it is finished
//     (forward_storage16, tiled::Stored) — the kernels in that type, each
//     output rounded once to the storage type (lse and dτ stay float). For
//     bfloat16 computed in float the stencil is evaluated to bfloat16's
//     accuracy (2^-14 relative per term, cpu/vector_moments.hpp,
//     StencilAccuracy::bf16), and the forward's tile products and all the
//     backward's products (S, dP, and the dV, dK, dQ accumulations with P and
//     dS rounded to bfloat16) run on a bfloat16 unit where the CPU
//     has one that outruns float FMA, AMX-BF16 tiles or AVX512-BF16 vectors
//     on AMD's CPUs (cpu/bf16_products.hpp, bf16::avx512bf16_preferred);
//     float16 keeps float's stencil and vector products (its outputs hold 11
//     bits, the bf16 stencil's gradient bound would not be below their
//     rounding: MATH.md §10).
// Rows that double cannot hold (raw scores beyond DBL_MAX, scores beyond 4096
// from a tiny τ: MATH.md §10, appendix A W12, W13) go on to the same kernels
// in long double. Rows that see a NaN or an Inf get NaN outputs (tiled.hpp,
// write_nonfinite_rows). The inspection outputs P and π come from the same
// kernels.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "backend.hpp"
#include "cpu/storage16.hpp"
#include "cpu/tiled.hpp"
#include "cpu/widen.hpp"
#include "cpu/isa.hpp"
#if defined(CONTINUUM_CPU_DISPATCH)
#  include "cpu/dispatch.hpp"
#endif

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

/// Row-id mask of `rows` (1 = in the subset) for a call of `n` rows.
inline std::vector<char> subset_of(const std::vector<index_t>& rows, index_t n) {
  std::vector<char> m(std::size_t(n), 0);
  for (index_t r : rows) m[std::size_t(r)] = 1;
  return m;
}

/// The caller's row statistics (RowStats) as the kernels in accum_t<T> take
/// them; a forward's are marked "none" on every row first (−1), for the rows
/// computed in another arithmetic.
template <class T>
tiled::RowStatistics<accum_t<T>> row_statistics(const ForwardArgs<T>& a) {
  if (!a.row_stats.ref) return {};
  const index_t rows = a.query.batch * a.query.heads * a.query.seq;
  std::fill(a.row_stats.ref, a.row_stats.ref + rows, index_t(-1));
  return {a.row_stats.values, a.row_stats.ref, row_stats_width(a.value.dim)};
}
template <class T>
tiled::RowStatistics<const accum_t<T>> row_statistics(const BackwardArgs<T>& a) {
  if (!a.row_stats.ref) return {};
  return {a.row_stats.values, a.row_stats.ref, row_stats_width(a.value.dim)};
}

[[noreturn]] inline void no_wider_type() {
  throw std::invalid_argument(
      "continuum: scores beyond the double range (raw q·k beyond DBL_MAX, or scale/τ·|q||k| far beyond 4096 with "
      "double storage) need a long double wider than double, which this platform lacks");
}

template <class T, class Stencil>
void forward_declined(const ForwardArgs<T>& a, const AttentionShape& sh, double scale,
                      const std::vector<index_t>& rows);
template <class T, class Stencil>
void backward_declined(const BackwardArgs<T>& a, const AttentionShape& sh, double scale,
                       const std::vector<index_t>& rows, std::vector<double>& dtau_rows);
template <class Stencil, class T>
void forward_storage16(const ForwardArgs<T>& a, const AttentionShape& sh, double scale, StencilAccuracy accuracy,
                       bf16::Unit unit);

/// The rows `rows` (null = every row) of a call computed in the wider type
/// W: the arguments converted once, the tiled kernels in W on those rows (the
/// rows W cannot hold go on to forward_declined), their outputs rounded once
/// into the caller's arguments.
template <class W, class Stencil, class T>
void forward_widened(const ForwardArgs<T>& a, const AttentionShape& sh, double scale,
                     const std::vector<index_t>* rows) {
  const WideForward<W, T> w(a, sh);
  const std::vector<char> subset = rows ? subset_of(*rows, sh.rows()) : std::vector<char>();
  tiled::forward_tiled<W, Stencil>(w.args, scale, rows ? subset.data() : nullptr,
                                     [&](const std::vector<index_t>& declined) {
                                       forward_declined<W, Stencil>(w.args, sh, scale, declined);
                                     });
  if (rows)
    for_rows(index_t(rows->size()), w.threads, [&](index_t r) { w.narrow(a, (*rows)[std::size_t(r)]); });
  else
    for_rows(sh.rows(), w.threads, [&](index_t r) { w.narrow(a, r); });
}

/// A whole forward of 16-bit storage computed in float: Q, K and V read as
/// they are and each output row rounded once into the caller's out where it
/// is finished (tiled::Stored: no copy of a whole tensor; a decode step
/// never copies its KV cache), the tile products on `unit` (bfloat16
/// storage: bf16_products.hpp) or the vector kernels; lse written as it is
/// (float), the inspection maps copied. The rows float cannot hold go to
/// double from the caller's arguments, after the others are written.
template <class Stencil, class T>
void forward_storage16(const ForwardArgs<T>& a, const AttentionShape& sh, double scale, StencilAccuracy accuracy,
                       bf16::Unit unit) {
  const WideForward<float, T> w(a, sh, /*copy=*/false);
  std::vector<index_t> declined;
  tiled::forward_tiled<float, Stencil>(w.args, tiled::Stored<T>{a.query, a.key, a.value, a.out}, scale, nullptr,
                                       [&](const std::vector<index_t>& rows) { declined = rows; }, unit, accuracy,
                                       row_statistics(a));
  if (a.lse != w.args.lse || a.probs || a.cell_mass)
    for_rows(sh.rows(), w.threads, [&](index_t r) { w.narrow(a, r); });
  if (!declined.empty()) forward_widened<double, Stencil>(a, sh, scale, &declined);
}

/// The backward counterpart. With `rows` (rows declined by the pass in T):
/// writes their dQ, adds their dK, dV terms to that pass's and sets their
/// entries of dtau_rows. Without: the whole call, every output written.
/// given: the forward's row statistics, when they are in W.
template <class W, class Stencil, class T>
void backward_widened(const BackwardArgs<T>& a, const AttentionShape& sh, double scale,
                      const std::vector<index_t>* rows, std::vector<double>& dtau_rows,
                      bf16::Unit unit = bf16::Unit::none, StencilAccuracy accuracy = StencilAccuracy::full,
                      tiled::RowStatistics<const W> given = {}) {
  const WideBackward<W, T> w(a, sh);
  const std::vector<char> subset = rows ? subset_of(*rows, sh.rows()) : std::vector<char>();
  const std::vector<double> dtau = tiled::backward_tiled<W, Stencil>(
      w.args, scale, rows ? subset.data() : nullptr,
      [&](const std::vector<index_t>& declined, std::vector<double>& dt) {
        backward_declined<W, Stencil>(w.args, sh, scale, declined, dt);
      },
      unit, accuracy, given);
  const auto assign = [](T* o, const W* x, index_t n) { convert_n(x, o, n); };
  const auto add = [](T* o, const W* x, index_t n) {
    for (index_t d = 0; d < n; ++d) o[d] = T(W(o[d]) + x[d]);
  };
  if (rows) {
    for_rows(index_t(rows->size()), w.threads, [&](index_t i) {
      const index_t r = (*rows)[std::size_t(i)];
      narrow_row(w.args.grad_query, a.grad_query, r);
      if (a.grad_temperature) dtau_rows[std::size_t(r)] = dtau[std::size_t(r)];
    });
    each_row(a.grad_key, w.args.grad_key, w.threads, add);
    each_row(a.grad_value, w.args.grad_value, w.threads, add);
  } else {
    each_row(a.grad_query, w.args.grad_query, w.threads, assign);
    each_row(a.grad_key, w.args.grad_key, w.threads, assign);
    each_row(a.grad_value, w.args.grad_value, w.threads, assign);
    dtau_rows = dtau;
  }
}

/// The rows the kernels in T declined, in the next wider type (wider_t<T>).
template <class T, class Stencil>
void forward_declined(const ForwardArgs<T>& a, const AttentionShape& sh, double scale,
                      const std::vector<index_t>& rows) {
  if constexpr (std::is_void<wider_t<T>>::value)
    no_wider_type();
  else
    forward_widened<wider_t<T>, Stencil>(a, sh, scale, &rows);
}
template <class T, class Stencil>
void backward_declined(const BackwardArgs<T>& a, const AttentionShape& sh, double scale,
                       const std::vector<index_t>& rows, std::vector<double>& dtau_rows) {
  if constexpr (std::is_void<wider_t<T>>::value)
    no_wider_type();
  else
    backward_widened<wider_t<T>, Stencil>(a, sh, scale, &rows, dtau_rows);
}

/// The stencil accuracy of 16-bit storage computed in float: bfloat16's
/// 2^-14 per term for bfloat16 (MATH.md §10, "The bfloat16 stencil"); float's
/// own for float16, whose 2^-11 rounding the bf16 terms' gradient error
/// (12 · 2^-14) would exceed.
template <class T>
constexpr StencilAccuracy stencil_accuracy() {
  return std::is_same<T, bfloat16>::value ? StencilAccuracy::bf16 : StencilAccuracy::full;
}

/// The CPU forward of one validated call (attention_impl<cpu_t>::forward),
/// compiled for this translation unit's instruction set (isa.hpp). Unit: with
/// bfloat16 storage computed in float, the bfloat16 unit of the tile products
/// (cpu/bf16_products.hpp; the caller checked bf16::usable(Unit)).
template <class T, class Stencil, bf16::Unit Unit = bf16::Unit::none>
void run_forward(const ForwardArgs<T>& args, const AttentionShape& shape, double scale) {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value || is_storage16_v<T>,
                "continuum CPU backend: T must be float, double, continuum::bfloat16 or continuum::float16");
  static_assert(Unit == bf16::Unit::none || std::is_same<T, bfloat16>::value,
                "the bfloat16 units take bfloat16 storage only");
  if constexpr (!std::is_same<T, double>::value) {  // float or 16-bit storage
    if (args.compute == Compute::float64) {  // (no row statistics: they would be double)
      row_statistics(args);
      return forward_widened<double, Stencil>(args, shape, scale, nullptr);
    }
    if constexpr (is_storage16_v<T>)  // storage only: computed in float
      return forward_storage16<Stencil>(args, shape, scale, stencil_accuracy<T>(), Unit);
  }
  if constexpr (!is_storage16_v<T>)
    tiled::forward_tiled<T, Stencil>(
        args, scale, nullptr,
        [&](const std::vector<index_t>& rows) { forward_declined<T, Stencil>(args, shape, scale, rows); },
        bf16::Unit::none, StencilAccuracy::full, row_statistics(args));
}

/// The CPU backward of one validated call (attention_impl<cpu_t>::backward);
/// Unit as for run_forward (S, dP and the dV, dK, dQ accumulations on it).
template <class T, class Stencil, bf16::Unit Unit = bf16::Unit::none>
void run_backward(const BackwardArgs<T>& args, const AttentionShape& shape, double scale) {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value || is_storage16_v<T>,
                "continuum CPU backend: T must be float, double, continuum::bfloat16 or continuum::float16");
  static_assert(Unit == bf16::Unit::none || std::is_same<T, bfloat16>::value,
                "the bfloat16 units take bfloat16 storage only");
  std::vector<double> dtau_rows;
  bool done = false;
  if constexpr (!std::is_same<T, double>::value) {  // float or 16-bit storage
    if (args.compute == Compute::float64) {
      backward_widened<double, Stencil>(args, shape, scale, nullptr, dtau_rows);
      done = true;
    } else if constexpr (is_storage16_v<T>) {  // storage only: computed in float
      backward_widened<float, Stencil>(args, shape, scale, nullptr, dtau_rows, Unit, stencil_accuracy<T>(),
                                       row_statistics(args));
      done = true;
    }
  }
  if constexpr (!is_storage16_v<T>)
    if (!done)
      dtau_rows = tiled::backward_tiled<T, Stencil>(
          args, scale, nullptr,
          [&](const std::vector<index_t>& rows, std::vector<double>& dt) {
            backward_declined<T, Stencil>(args, shape, scale, rows, dt);
          },
          bf16::Unit::none, StencilAccuracy::full, row_statistics(args));
  if (args.grad_temperature) tiled::write_grad_temperature(args, dtau_rows);
}

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE

/// The CPU backend. Built with CONTINUUM_CPU_DISPATCH (the project's own
/// binaries: the CMake target continuum::cpu_dispatch), each call runs the
/// kernels compiled for the best instruction set the running CPU has
/// (cpu/dispatch.hpp, cpu_dispatch::automatic()); otherwise the kernels of
/// this translation unit's target (-march), inline, with the same choice of
/// bfloat16 unit.
template <>
struct attention_impl<cpu_t> {
  template <class T, class Stencil>
  static void forward(const ForwardArgs<T>& args, const AttentionShape& shape, double scale) {
#if defined(CONTINUUM_CPU_DISPATCH)
    cpu_dispatch::forward(args, shape, scale, Stencil{});
#else
    namespace bf16 = cpu_detail::bf16;
    if constexpr (std::is_same<T, bfloat16>::value) {
      if (bf16::amx_usable()) return cpu_detail::run_forward<T, Stencil, bf16::Unit::amx>(args, shape, scale);
      if (bf16::avx512bf16_preferred())
        return cpu_detail::run_forward<T, Stencil, bf16::Unit::avx512bf16>(args, shape, scale);
    }
    cpu_detail::run_forward<T, Stencil>(args, shape, scale);
#endif
  }
  template <class T, class Stencil>
  static void backward(const BackwardArgs<T>& args, const AttentionShape& shape, double scale) {
#if defined(CONTINUUM_CPU_DISPATCH)
    cpu_dispatch::backward(args, shape, scale, Stencil{});
#else
    namespace bf16 = cpu_detail::bf16;
    if constexpr (std::is_same<T, bfloat16>::value) {
      if (bf16::amx_usable()) return cpu_detail::run_backward<T, Stencil, bf16::Unit::amx>(args, shape, scale);
      if (bf16::avx512bf16_preferred())
        return cpu_detail::run_backward<T, Stencil, bf16::Unit::avx512bf16>(args, shape, scale);
    }
    cpu_detail::run_backward<T, Stencil>(args, shape, scale);
#endif
  }
};

}  // namespace continuum
