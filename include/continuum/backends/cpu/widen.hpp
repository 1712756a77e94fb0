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
// inputs and outputs in the wider type (2× their size).
#pragma once

#include <limits>
#include <type_traits>
#include <vector>

#include "../../attention/params.hpp"
#include "../../attention/validate.hpp"
#include "isa.hpp"
#include "storage16.hpp"
#if defined(__F16C__)
#  include <immintrin.h>
#endif

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

/// dst[0, n) = src[0, n) converted: exact where it widens, to nearest even
/// where it narrows (float ↔ float16 eight at a time with F16C, which the
/// avx2 and avx512 kernels have — the same values as Eigen's scalar
/// conversion, which does the rest; a 16-bit call's conversions would
/// otherwise cost as much as a fifth of a forward).
template <class D, class S>
inline void convert_n(const S* src, D* dst, index_t n) {
  index_t i = 0;
#if defined(__F16C__)
  if constexpr (std::is_same<S, float16>::value && std::is_same<D, float>::value)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  if constexpr (std::is_same<S, float>::value && std::is_same<D, float16>::value)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) dst[i] = D(src[i]);
}

/// A contiguous BHSD copy in W of a view (its shape; strides of its own).
/// An empty view stays empty with a non-null pointer (validate.hpp, settled).
template <class W, class T>
TensorView<const W> widened(const TensorView<const T>& v, std::vector<W>& buf) {
  buf.assign(std::size_t(detail::element_count(v)), W(0));
  TensorView<W> w = TensorView<W>::bhsd(buf.data(), v.batch, v.heads, v.seq, v.dim);
  if (!buf.empty())
    for (index_t b = 0; b < v.batch; ++b)
      for (index_t h = 0; h < v.heads; ++h)
        for (index_t s = 0; s < v.seq; ++s) {
          convert_n(v.row(b, h, s), w.row(b, h, s), v.dim);
        }
  detail::settle_if_empty(w);
  return w;
}

/// A zeroed contiguous W output of the shape of `v` (null when v is).
template <class W, class T>
TensorView<W> widened_output(const TensorView<T>& v, std::vector<W>& buf) {
  if (v.data == nullptr) return {};
  buf.assign(std::size_t(detail::element_count(v)), W(0));
  TensorView<W> w = TensorView<W>::bhsd(buf.data(), v.batch, v.heads, v.seq, v.dim);
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

/// What forward and backward arguments share, in W: Q, K, V (copied into q,
/// k, v) and the options (AttentionOptions; the temperature's array into
/// tau), computing in W's own arithmetic.
template <class Args, class WideArgs, class W>
void widen_shared(const Args& a, const AttentionShape& s, WideArgs& w, std::vector<W>& q, std::vector<W>& k,
                  std::vector<W>& v, std::vector<W>& tau) {
  w.query = widened(a.query, q);
  w.key = widened(a.key, k);
  w.value = widened(a.value, v);
  AttentionOptions<W>& o = w;
  o.kernel = a.kernel;
  o.temperature = widened(a.temperature, s, tau);
  o.scale = a.scale;
  o.visibility = a.visibility;
  o.compute = Compute::automatic;
  o.num_threads = a.num_threads;
}

/// Forward arguments of T storage in W, the inspection maps included.
template <class W, class T>
struct WideForward {
  std::vector<W> q, k, v, o, lse, tau, probs, cell_mass;
  index_t len_k = 0;
  ForwardArgs<W> args;
  WideForward(const ForwardArgs<T>& a, const AttentionShape& s) : len_k(s.len_k) {
    widen_shared(a, s, args, q, k, v, tau);
    args.out = widened_output(a.out, o);
    if (a.lse) {
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
  /// Rounds row `row`'s outputs into the caller's arguments.
  void narrow(const ForwardArgs<T>& a, index_t row) const {
    narrow_row(args.out, a.out, row);
    if (a.lse) a.lse[row] = accum_t<T>(lse[std::size_t(row)]);
    for (index_t j = 0; j < len_k; ++j) {
      if (a.probs) a.probs[row * len_k + j] = T(probs[std::size_t(row * len_k + j)]);
      if (a.cell_mass) a.cell_mass[row * len_k + j] = T(cell_mass[std::size_t(row * len_k + j)]);
    }
  }
};

/// Backward arguments of T storage in W (`out` is not carried: the CPU
/// backward does not read it).
template <class W, class T>
struct WideBackward {
  std::vector<W> q, k, v, go, gq, gk, gv, gt, tau;
  BackwardArgs<W> args;
  WideBackward(const BackwardArgs<T>& a, const AttentionShape& s) {
    widen_shared(a, s, args, q, k, v, tau);
    args.grad_out = widened(a.grad_out, go);
    args.grad_query = widened_output(a.grad_query, gq);
    args.grad_key = widened_output(a.grad_key, gk);
    args.grad_value = widened_output(a.grad_value, gv);
    if (a.grad_temperature) {  // only asks for the per-row dτ terms (the caller writes dτ)
      gt.assign(std::size_t(detail::temperature_count(a.temperature, s)), W(0));
      args.grad_temperature = gt.data();
    }
  }
};

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
