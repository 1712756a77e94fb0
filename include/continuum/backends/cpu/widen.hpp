// backends/cpu/widen.hpp — a call's rows computed in a wider type (docs/MATH.md
// §10): float storage in double (Compute::float64, and the rows float cannot
// hold), double in long double (the rows double cannot hold: raw scores
// beyond DBL_MAX, tiny τ). The arguments are converted once, so that the one
// tiled kernel family runs on them in the wider type, and each output is
// rounded back once.
//
// Every element is converted (exactly: float ⊂ double ⊂ long double), hidden
// ones included; the kernels never read those (masking is structural), so
// what a row cannot see still never reaches its result. Memory: a copy of the
// inputs and outputs in the wider type (2× their size), taken from the
// calling thread's spare blocks (SparePool). The conversions run on the
// call's threads, row by row (serial, with fresh blocks faulted in on every
// call, they made 16-bit calls up to 2× slower than float ones:
// docs/PERFORMANCE.md, "The 16-bit calls' copies").
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "../../attention/params.hpp"
#include "../../attention/validate.hpp"
#include "isa.hpp"
#include "spare_pool.hpp"
#include "storage16.hpp"
#include "tiled.hpp"

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

/// The type the rows that T cannot hold are computed in: double for float,
/// long double for double where long double has a wider exponent range
/// (x86-64 and AArch64 Linux; not MSVC, whose long double is double), void
/// where there is none.
template <class T>
struct wider {
  using type = void;
};
template <>
struct wider<float> {
  using type = double;
};
template <>
struct wider<double> {
  using type = std::conditional_t<(std::numeric_limits<long double>::max_exponent >
                                   std::numeric_limits<double>::max_exponent),
                                  long double, void>;
};
template <class T>
using wider_t = typename wider<T>::type;

/// f(r) for every r in [0, n), on up to `threads` threads (static schedule),
/// each in the caller's floating-point modes (tiled.hpp, CallerFloatModes).
template <class F>
void for_rows(index_t n, int threads, F&& f) {
  threads = int(std::max<index_t>(1, std::min<index_t>(threads, n)));  // n = 0: an empty view
  const tiled::CallerFloatModes modes;
#if defined(_OPENMP)
#  pragma omp parallel num_threads(threads) if (threads > 1 && n > 1)
#endif
  {
    const tiled::CallerFloatModes::Adopt in_caller_modes(modes);
#if defined(_OPENMP)
#  pragma omp for schedule(static)
#endif
    for (index_t r = 0; r < n; ++r) f(r);
  }
}

/// f(row of v, row of w, dim) for every (batch, head, position) row of two
/// views of one shape, on `threads` threads.
template <class A, class B, class F>
void each_row(const TensorView<A>& v, const TensorView<B>& w, int threads, F&& f) {
  if (v.data == nullptr || w.data == nullptr || v.dim == 0) return;
  for_rows(v.batch * v.heads * v.seq, threads, [&](index_t r) {
    const index_t s = r % v.seq, h = (r / v.seq) % v.heads, b = r / (v.seq * v.heads);
    f(v.row(b, h, s), w.row(b, h, s), v.dim);
  });
}

/// A contiguous BHSD copy in W of a view (its shape; strides of its own).
/// An empty view stays empty with a non-null pointer (validate.hpp, settled).
template <class W, class T>
TensorView<const W> widened(const TensorView<const T>& v, Buffer<W>& buf, int threads) {
  TensorView<W> w =
      TensorView<W>::bhsd(buf.allocate(std::size_t(detail::element_count(v))), v.batch, v.heads, v.seq, v.dim);
  each_row(v, w, threads, [](const T* x, W* y, index_t n) { convert_n(x, y, n); });
  detail::settle_if_empty(w);
  return w;
}

/// A zeroed contiguous W output of the shape of `v` (null when v is).
template <class W, class T>
TensorView<W> widened_output(const TensorView<T>& v, Buffer<W>& buf, int threads) {
  if (v.data == nullptr) return {};
  TensorView<W> w =
      TensorView<W>::bhsd(buf.allocate(std::size_t(detail::element_count(v))), v.batch, v.heads, v.seq, v.dim);
  each_row(w, w, threads, [](W* y, W*, index_t n) { std::fill_n(y, n, W(0)); });
  detail::settle_if_empty(w);
  return w;
}

/// Row `row` (id (b·Hq + h)·Lq + i) of a wide output into the caller's view.
template <class W, class T>
void narrow_row(const TensorView<W>& w, const TensorView<T>& v, index_t row) {
  if (v.data == nullptr || v.dim == 0) return;
  const index_t i = row % v.seq, h = (row / v.seq) % v.heads, b = row / (v.seq * v.heads);
  convert_n(w.row(b, h, i), v.row(b, h, i), v.dim);
}

/// The temperature in W (its array copied).
template <class W, class T>
Temperature<W> widened(const Temperature<T>& t, const AttentionShape& s, std::vector<W>& buf) {
  Temperature<W> w;
  w.shape = t.shape;
  w.value = W(t.value);
  if (t.shape != TemperatureShape::scalar) {
    buf.assign(t.data, t.data + detail::temperature_count(t, s));
    w.data = buf.data();
  }
  return w;
}

/// A view of v's shape without data.
template <class W, class T>
TensorView<W> shape_only(const TensorView<T>& v) {
  return TensorView<W>::bhsd(nullptr, v.batch, v.heads, v.seq, v.dim);
}

/// What forward and backward arguments share, in W: Q, K, V (copied into q,
/// k, v) and the options (AttentionOptions; the temperature's array into
/// tau), computing in W's own arithmetic. copy false: Q, K and V are not
/// copied (the kernels read the caller's: tiled::Stored), their views in w
/// give only the shapes (no data).
template <class Args, class WideArgs, class W>
void widen_shared(const Args& a, const AttentionShape& s, WideArgs& w, Buffer<W>& q, Buffer<W>& k, Buffer<W>& v,
                  std::vector<W>& tau, int threads, bool copy = true) {
  if (copy) {
    w.query = widened(a.query, q, threads);
    w.key = widened(a.key, k, threads);
    w.value = widened(a.value, v, threads);
  } else {
    w.query = shape_only<const W>(a.query);
    w.key = shape_only<const W>(a.key);
    w.value = shape_only<const W>(a.value);
  }
  AttentionOptions<W>& o = w;
  o.kernel = a.kernel;
  o.temperature = widened(a.temperature, s, tau);
  o.scale = a.scale;
  o.visibility = a.visibility;
  o.compute = Compute::automatic;
  o.num_threads = a.num_threads;
}

/// Forward arguments of T storage in W, the inspection maps included. copy
/// false (16-bit storage computed in float: forward_storage16): Q, K, V and
/// out are not copied — the kernels read and write the caller's in their
/// storage type (tiled::Stored), these views give only the shapes — and lse
/// is the caller's own where it has W's type.
template <class W, class T>
struct WideForward {
  Buffer<W> q, k, v, o;
  std::vector<W> lse, tau, probs, cell_mass;
  index_t len_k = 0;
  int threads = 1;
  ForwardArgs<W> args;
  WideForward(const ForwardArgs<T>& a, const AttentionShape& s, bool copy = true)
      : len_k(s.len_k), threads(tiled::resolve_threads(a.num_threads)) {
    widen_shared(a, s, args, q, k, v, tau, threads, copy);
    args.out = copy ? widened_output(a.out, o, threads) : shape_only<W>(a.out);
    if constexpr (std::is_same<accum_t<T>, W>::value)
      if (!copy) args.lse = a.lse;
    if (a.lse && !args.lse) {
      lse.assign(std::size_t(s.rows()), W(0));
      args.lse = lse.data();
    }
    if (a.probs) {
      probs.assign(std::size_t(s.rows() * s.len_k), W(0));
      args.probs = probs.data();
    }
    if (a.cell_mass) {
      cell_mass.assign(std::size_t(s.rows() * s.len_k), W(0));
      args.cell_mass = cell_mass.data();
    }
  }
  /// Rounds row `row`'s outputs into the caller's arguments (those the
  /// kernels did not write there themselves).
  void narrow(const ForwardArgs<T>& a, index_t row) const {
    if (args.out.data) narrow_row(args.out, a.out, row);
    if (!lse.empty()) a.lse[row] = accum_t<T>(lse[std::size_t(row)]);
    const std::size_t r0 = std::size_t(row * len_k);
    if (a.probs) convert_n(probs.data() + r0, a.probs + r0, len_k);
    if (a.cell_mass) convert_n(cell_mass.data() + r0, a.cell_mass + r0, len_k);
  }
};

/// Backward arguments of T storage in W (`out` is not carried: the CPU
/// backward does not read it).
template <class W, class T>
struct WideBackward {
  Buffer<W> q, k, v, go, gq, gk, gv;
  std::vector<W> gt, tau;
  int threads = 1;
  BackwardArgs<W> args;
  WideBackward(const BackwardArgs<T>& a, const AttentionShape& s) : threads(tiled::resolve_threads(a.num_threads)) {
    widen_shared(a, s, args, q, k, v, tau, threads);
    args.grad_out = widened(a.grad_out, go, threads);
    args.grad_query = widened_output(a.grad_query, gq, threads);
    args.grad_key = widened_output(a.grad_key, gk, threads);
    args.grad_value = widened_output(a.grad_value, gv, threads);
    if (a.grad_temperature) {  // only asks for the per-row dτ terms (the caller writes dτ)
      gt.assign(std::size_t(detail::temperature_count(a.temperature, s)), W(0));
      args.grad_temperature = gt.data();
    }
  }
};

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
