// attention/validate.hpp — argument checks shared by every backend (host only).
// Every violation throws std::invalid_argument naming the function, the
// argument and the expected shape or range.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "params.hpp"

namespace continuum {

/// Problem sizes resolved from validated arguments.
struct AttentionShape {
  index_t batch = 0, heads_q = 0, heads_kv = 0, len_q = 0, len_k = 0, dim = 0, dim_v = 0;
  index_t group() const { return heads_kv > 0 ? heads_q / heads_kv : 0; }
  /// Query rows B·Hq·Lq (validated to be at most 2^62). 0 when any factor is,
  /// tested first: B·Hq alone may overflow when Lq = 0 (a valid empty problem).
  index_t rows() const { return batch == 0 || heads_q == 0 || len_q == 0 ? 0 : batch * heads_q * len_q; }
};

namespace detail {

inline std::string shape_str(index_t b, index_t h, index_t s, index_t d) {
  return "[" + std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(s) + ", " +
         std::to_string(d) + "]";
}
template <class T>
std::string shape_str(const TensorView<T>& v) {
  return shape_str(v.batch, v.heads, v.seq, v.dim);
}

/// A number as the caller would write it (%.9g; "inf", "nan").
inline std::string num(double x) {
  std::ostringstream os;
  os.precision(9);
  os << x;
  return os.str();
}

[[noreturn]] inline void fail(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string("continuum::") + fn + ": " + what);
}

/// The bound on every element count, element offset and problem size formed
/// from the arguments: 2^62. Products and sums of checked sizes and strides
/// never overflow index_t, and the kernels' index arithmetic (adding a tile
/// width, one more product with a checked size) keeps a margin.
inline constexpr index_t max_extent = index_t(1) << 62;

/// r = a·b for a, b in [0, max_extent]; false when the product exceeds max_extent.
inline bool mul_within(index_t a, index_t b, index_t& r) {
  if (a != 0 && b > max_extent / a) return false;
  r = a * b;
  return true;
}

/// r = Π n (0 when any n is 0, whatever the others); false when it exceeds max_extent.
inline bool product_within(std::initializer_list<index_t> n, index_t& r) {
  for (index_t x : n)
    if (x == 0) return r = 0, true;
  r = 1;
  for (index_t x : n)
    if (!mul_within(r, x, r)) return false;
  return true;
}

/// Elements of a view whose sizes check_view accepted.
template <class T>
index_t element_count(const TensorView<T>& v) {
  index_t n = 0;
  product_within({v.batch, v.heads, v.seq, v.dim}, n);
  return n;
}

template <class T>
std::string strides_str(const TensorView<T>& v) {
  return "(" + std::to_string(v.stride_batch) + ", " + std::to_string(v.stride_head) + ", " +
         std::to_string(v.stride_seq) + ", " + std::to_string(v.stride_dim) + ")";
}

/// Checks one view: expected sizes, non-negative strides, unit dim stride,
/// element count and furthest element offset within max_extent (also for a
/// view with no element), non-null data when it has elements, its bytes
/// inside the address space, and (for outputs) that no two elements share
/// memory: sorted by stride, each axis starts past the span of the smaller
/// ones (the layouts of contiguous, permuted, sliced and packed tensors).
template <class T>
void check_view(const char* fn, const char* name, const TensorView<T>& v, index_t b, index_t h,
                index_t s, index_t d, const char* expected, bool is_output) {
  if (v.batch != b || v.heads != h || v.seq != s || v.dim != d)
    fail(fn, std::string(name) + ": expected shape " + expected + " = " + shape_str(b, h, s, d) +
                 ", got " + shape_str(v));
  if (v.stride_dim != 1)
    fail(fn, std::string(name) + ": the dim (last) axis must be contiguous (stride_dim == 1), got " +
                 std::to_string(v.stride_dim));
  if (v.stride_batch < 0 || v.stride_head < 0 || v.stride_seq < 0)
    fail(fn, std::string(name) + ": strides must be >= 0, got " + strides_str(v));
  index_t count = 0;
  if (!product_within({v.batch, v.heads, v.seq, v.dim}, count))
    fail(fn, std::string(name) + ": shape " + shape_str(v) + " has more than 2^62 elements");
  {  // furthest element offset, over the axes of size >= 2
    const index_t n[4] = {v.batch, v.heads, v.seq, v.dim};
    const index_t st[4] = {v.stride_batch, v.stride_head, v.stride_seq, 1};
    index_t far = 0;
    for (int a = 0; a < 4; ++a) {
      index_t term = 0;
      if (n[a] >= 2 && (!mul_within(st[a], n[a] - 1, term) || term > max_extent - far))
        fail(fn, std::string(name) + ": shape " + shape_str(v) + " with strides " + strides_str(v) +
                     " reaches element offsets beyond 2^62");
      far += term;
    }
    if (count != 0 && v.data == nullptr)
      fail(fn, std::string(name) + ": data is null but the shape " + shape_str(v) + " is not empty");
    const auto p = reinterpret_cast<std::uintptr_t>(v.data);
    if (count != 0 && static_cast<std::uintptr_t>(far) >=
                          (std::numeric_limits<std::uintptr_t>::max() - p) / sizeof(T))
      fail(fn, std::string(name) + ": shape " + shape_str(v) + " with strides " + strides_str(v) +
                   " runs past the end of the address space");
  }
  if (is_output && count != 0) {
    index_t sz[3] = {v.batch, v.heads, v.seq};
    index_t st[3] = {v.stride_batch, v.stride_head, v.stride_seq};
    const char* axis[3] = {"batch", "head", "seq"};
    for (int a = 0; a < 3; ++a)
      for (int c = a + 1; c < 3; ++c)
        if (st[c] < st[a]) {
          std::swap(st[a], st[c]);
          std::swap(sz[a], sz[c]);
          std::swap(axis[a], axis[c]);
        }
    index_t extent = v.dim;
    for (int a = 0; a < 3; ++a) {
      if (sz[a] <= 1) continue;
      if (st[a] < extent)
        fail(fn, std::string(name) + ": output view overlaps itself: the " + axis[a] + " stride " +
                     std::to_string(st[a]) + " is smaller than the " + std::to_string(extent) +
                     " elements the smaller-stride axes span (shape " + shape_str(v) + ", strides " +
                     strides_str(v) + ")");
      extent = st[a] * (sz[a] - 1) + extent;
    }
  }
}

/// The memory a buffer touches, in bytes: rows of `row` bytes starting at
/// base + Σ_a i_a·step[a], 0 <= i_a < n[a], axes in ascending step order (a
/// view: its batch, head and seq axes; an array: one row). `nested` when the
/// rows lie in address order without overlap (every output view, by
/// check_view; every array).
struct Region {
  const char* name = "";
  std::uintptr_t base = 0, row = 0, last = 0;  ///< every byte lies in [base, last)
  index_t n[3] = {1, 1, 1};
  std::uintptr_t step[3] = {0, 0, 0};
  bool nested = true;
  bool empty() const { return last <= base; }
  index_t rows() const { return n[0] * n[1] * n[2]; }
};

/// The region of a view that check_view accepted (empty: no element or null).
template <class T>
Region region_of(const char* name, const TensorView<T>& v) {
  Region r;
  r.name = name;
  if (v.data == nullptr || element_count(v) == 0) return r;
  r.base = reinterpret_cast<std::uintptr_t>(v.data);
  r.row = static_cast<std::uintptr_t>(v.dim) * sizeof(T);
  const index_t n[3] = {v.batch, v.heads, v.seq}, st[3] = {v.stride_batch, v.stride_head, v.stride_seq};
  int order[3] = {0, 1, 2};
  for (int a = 0; a < 3; ++a)
    for (int c = a + 1; c < 3; ++c)
      if (st[order[c]] < st[order[a]]) std::swap(order[a], order[c]);
  std::uintptr_t extent = r.row;
  for (int a = 0; a < 3; ++a) {
    r.n[a] = n[order[a]];
    r.step[a] = static_cast<std::uintptr_t>(st[order[a]]) * sizeof(T);
    if (r.n[a] <= 1) continue;
    if (r.step[a] < extent) r.nested = false;
    extent += r.step[a] * static_cast<std::uintptr_t>(r.n[a] - 1);
  }
  r.last = r.base + extent;  // check_view: inside the address space
  return r;
}

/// The region of a contiguous array of `count` elements (empty: none or null).
template <class T>
Region region_of(const char* fn, const char* name, const T* p, index_t count) {
  Region r;
  r.name = name;
  if (p == nullptr || count <= 0) return r;
  r.base = reinterpret_cast<std::uintptr_t>(p);
  if (static_cast<std::uintptr_t>(count) > (std::numeric_limits<std::uintptr_t>::max() - r.base) / sizeof(T))
    fail(fn, std::string(name) + ": " + std::to_string(count) + " elements run past the end of the address space");
  r.row = static_cast<std::uintptr_t>(count) * sizeof(T);
  r.last = r.base + r.row;
  return r;
}

/// Whether the nested region w has a byte in [lo, hi): the row with the
/// largest start <= hi - 1 (found axis by axis, largest step first, as rows
/// lie in address order) is the only candidate.
inline bool touches(const Region& w, std::uintptr_t lo, std::uintptr_t hi) {
  if (hi <= w.base || lo >= w.last) return false;
  const std::uintptr_t target = (hi < w.last ? hi : w.last) - 1;
  std::uintptr_t off = target - w.base;
  for (int a = 2; a >= 0; --a) {
    if (w.n[a] <= 1) continue;
    const std::uintptr_t q = off / w.step[a], top = static_cast<std::uintptr_t>(w.n[a] - 1);
    off -= (q < top ? q : top) * w.step[a];
  }
  return target - off + w.row > lo;
}

/// Whether two regions share a byte, element by element; `w` must be nested.
inline bool share_memory(const Region& w, const Region& x) {
  if (w.empty() || x.empty() || w.last <= x.base || x.last <= w.base) return false;
  if (x.nested && x.rows() < w.rows()) return share_memory(x, w);  // walk the fewer rows
  for (index_t i2 = 0; i2 < x.n[2]; ++i2)
    for (index_t i1 = 0; i1 < x.n[1]; ++i1)
      for (index_t i0 = 0; i0 < x.n[0]; ++i0) {
        const std::uintptr_t start = x.base + static_cast<std::uintptr_t>(i2) * x.step[2] +
                                     static_cast<std::uintptr_t>(i1) * x.step[1] +
                                     static_cast<std::uintptr_t>(i0) * x.step[0];
        if (touches(w, start, start + x.row)) return true;
      }
  return false;
}

/// No buffer the call writes may share an element with any other buffer it
/// reads or writes (reads may share memory with each other).
template <std::size_t R, std::size_t W>
void check_no_aliasing(const char* fn, const Region (&reads)[R], const Region (&writes)[W]) {
  for (std::size_t o = 0; o < W; ++o) {
    for (const Region& r : reads)
      if (share_memory(writes[o], r))
        fail(fn, std::string(writes[o].name) + ": shares memory with the input " + r.name +
                     " (outputs must not overlap any other argument)");
    for (std::size_t p = 0; p < o; ++p)
      if (share_memory(writes[o], writes[p]))
        fail(fn, std::string(writes[o].name) + ": shares memory with the output " + writes[p].name +
                     " (outputs must not overlap any other argument)");
  }
}

/// Problem sizes that no single view bounds: query rows B·Hq·Lq (lse, a
/// per-query temperature), key rows B·Hk·Lk, range entries B·Lq and, when P
/// or π is requested, B·Hq·Lq·Lk; each within max_extent.
inline void check_problem_size(const char* fn, const AttentionShape& s, bool ranges, bool maps) {
  index_t n = 0;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) fail(fn, what + " has more than 2^62 elements");
  };
  need(product_within({s.batch, s.heads_q, s.len_q}, n), "[B, Hq, Lq] = [" + std::to_string(s.batch) + ", " +
                                                              std::to_string(s.heads_q) + ", " + std::to_string(s.len_q) + "]");
  need(product_within({s.batch, s.heads_kv, s.len_k}, n), "[B, Hk, Lk] = [" + std::to_string(s.batch) + ", " +
                                                               std::to_string(s.heads_kv) + ", " + std::to_string(s.len_k) + "]");
  if (ranges)
    need(product_within({s.batch, s.len_q}, n), "visibility.range_lo/range_hi: [B, Lq] = [" +
                                                    std::to_string(s.batch) + ", " + std::to_string(s.len_q) + "]");
  if (maps)
    need(product_within({s.batch, s.heads_q, s.len_q, s.len_k}, n),
         "probs / cell_mass: [B, Hq, Lq, Lk] = " + shape_str(s.batch, s.heads_q, s.len_q, s.len_k));
}

/// Elements of RowStats::values (0 when none): both pointers or neither, and
/// [B, Hq, Lq, row_stats_width(Dv)] within 2^62.
template <class RS>
index_t row_stats_count(const char* fn, const RS& st, const AttentionShape& s) {
  if ((st.values == nullptr) != (st.ref == nullptr))
    fail(fn, "row_stats: values and ref go together (both given, or neither)");
  index_t n = 0;
  if (st.values == nullptr) return 0;
  if (!product_within({s.batch, s.heads_q, s.len_q, row_stats_width(s.dim_v)}, n))
    fail(fn, "row_stats: [B, Hq, Lq, Dv + 5] has more than 2^62 elements");
  return n;
}

/// Elements of the temperature array (0 for a scalar) and of dτ (1 for a scalar).
template <class T>
index_t temperature_count(const Temperature<T>& t, const AttentionShape& s) {
  if (t.shape == TemperatureShape::per_head) return s.heads_q;
  if (t.shape == TemperatureShape::per_query) return s.rows();
  return 1;
}

/// Checks τ: finite and > 0 (every element), and c = scale / τ finite in
/// double (the CPU kernels form it in double or wider) and, with `fold_in_float`, at most FLT_MAX (the
/// kernels that form c in float: the CUDA backend's fp32 accumulator; the
/// CPU computes such rows in double).
template <class T>
void check_temperature(const char* fn, const Temperature<T>& t, const AttentionShape& s, double scale,
                       bool fold_in_float = false) {
  // where < 0: the scalar; otherwise a flat index into the per-head or
  // per-query array (the message is built only on failure).
  auto check_one = [&](T tau, index_t where) {
    const bool bad_value = !(tau > T(0)) || !std::isfinite(static_cast<double>(tau));
    const double c = scale / static_cast<double>(tau);
    const bool overflow = !bad_value && !std::isfinite(c);
    const bool float_overflow =
        !bad_value && !overflow && fold_in_float && !(c <= double(std::numeric_limits<float>::max()));
    if (!bad_value && !overflow && !float_overflow) return;
    std::string name = "temperature";
    if (where >= 0) {
      if (t.shape == TemperatureShape::per_head) {
        name += "[" + std::to_string(where) + "] (per_head, shape [Hq])";
      } else {
        const index_t i = where % s.len_q, bh = where / s.len_q;
        name += "[" + std::to_string(bh / s.heads_q) + ", " + std::to_string(bh % s.heads_q) + ", " +
                std::to_string(i) + "] (per_query, shape [B, Hq, Lq])";
      }
    }
    if (bad_value) fail(fn, name + ": must be finite and > 0, got " + num(static_cast<double>(tau)));
    if (overflow)
      fail(fn, name + ": too small, scale / temperature = " + num(scale) + " / " +
                   num(static_cast<double>(tau)) + " overflows");
    fail(fn, name + ": too small for this kernel, scale / temperature = " + num(scale) + " / " +
                 num(static_cast<double>(tau)) + " = " + num(c) +
                 " overflows float, in which the kernel forms it (the CUDA backend's float "
                 "accumulator; the CPU backend computes such rows in double)");
  };
  switch (t.shape) {
    case TemperatureShape::scalar: check_one(t.value, -1); break;
    case TemperatureShape::per_head: {
      if (t.data == nullptr && s.heads_q > 0)
        fail(fn, "temperature: per_head needs data of shape [Hq] = [" + std::to_string(s.heads_q) +
                     "], got null");
      for (index_t h = 0; h < s.heads_q; ++h) check_one(t.data[h], h);
      break;
    }
    case TemperatureShape::per_query: {
      const index_t n = s.rows();
      if (t.data == nullptr && n > 0)
        fail(fn, "temperature: per_query needs data of shape [B, Hq, Lq] = [" +
                     std::to_string(s.batch) + ", " + std::to_string(s.heads_q) + ", " +
                     std::to_string(s.len_q) + "], got null");
      for (index_t k = 0; k < n; ++k) check_one(t.data[k], k);
      break;
    }
    default: fail(fn, "temperature: unknown shape");
  }
}

/// The softmax scale: finite and > 0 (at most FLT_MAX with `fold_in_float`,
/// see check_temperature); default 1/sqrt(D), which needs D >= 1.
inline double check_scale(const char* fn, const std::optional<double>& scale, index_t dim,
                          bool fold_in_float = false) {
  if (!scale) {
    if (dim < 1) fail(fn, "scale: the default 1/sqrt(head_dim) needs head_dim >= 1, got " + std::to_string(dim));
    return 1.0 / std::sqrt(static_cast<double>(dim));
  }
  if (!(*scale > 0.0) || !std::isfinite(*scale))
    fail(fn, "scale: must be finite and > 0, got " + num(*scale));
  if (fold_in_float && !(*scale <= double(std::numeric_limits<float>::max())))
    fail(fn, "scale: " + num(*scale) + " overflows float, in which this kernel forms scale / temperature");
  return *scale;
}

inline void check_visibility(const char* fn, const Visibility& v, const AttentionShape& s) {
  if ((v.range_lo == nullptr) != (v.range_hi == nullptr))
    fail(fn, "visibility.range_lo / range_hi: give both (each [B, Lq] = [" + std::to_string(s.batch) +
                 ", " + std::to_string(s.len_q) + "]) or neither");
  if (v.range_lo != nullptr) {
    const index_t n = s.batch * s.len_q;
    for (index_t k = 0; k < n; ++k) {
      const index_t lo = v.range_lo[k], hi = v.range_hi[k];
      if (lo < 0 || hi > s.len_k || lo > hi)
        fail(fn, "visibility.range_lo/range_hi[" + std::to_string(k / (s.len_q > 0 ? s.len_q : 1)) +
                     ", " + std::to_string(s.len_q > 0 ? k % s.len_q : 0) + "]: need 0 <= lo <= hi <= Lk = " +
                     std::to_string(s.len_k) + ", got [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + ")");
    }
  }
}

inline void check_threads(const char* fn, int n) {
  if (n < 0) fail(fn, "num_threads: must be >= 0 (0 = runtime default), got " + std::to_string(n));
}

/// Shapes from query/key/value and the GQA rule.
template <class T>
AttentionShape resolve_shape(const char* fn, const TensorView<const T>& q, const TensorView<const T>& k,
                             const TensorView<const T>& v) {
  AttentionShape s;
  s.batch = q.batch; s.heads_q = q.heads; s.len_q = q.seq; s.dim = q.dim;
  s.heads_kv = k.heads; s.len_k = k.seq; s.dim_v = v.dim;
  if (q.batch < 0 || q.heads < 0 || q.seq < 0 || q.dim < 0)
    fail(fn, "query: sizes must be >= 0, got " + shape_str(q));
  if (k.batch < 0 || k.heads < 0 || k.seq < 0 || k.dim < 0)
    fail(fn, "key: sizes must be >= 0, got " + shape_str(k));
  if (v.dim < 0) fail(fn, "value: sizes must be >= 0, got " + shape_str(v));
  if (s.heads_q > 0 && (s.heads_kv <= 0 || s.heads_q % s.heads_kv != 0))
    fail(fn, "key: heads must divide query heads (GQA/MQA: Hq = " + std::to_string(s.heads_q) +
                 " must be a multiple of Hk), got Hk = " + std::to_string(s.heads_kv));
  check_view(fn, "query", q, s.batch, s.heads_q, s.len_q, s.dim, "[B, Hq, Lq, D]", false);
  check_view(fn, "key", k, s.batch, s.heads_kv, s.len_k, s.dim, "[B, Hk, Lk, D]", false);
  if (v.seq != k.seq)  // neither is "the" Lk: name both
    fail(fn, "key and value: seq_len (Lk) must match, got key " + std::to_string(k.seq) + ", value " +
                 std::to_string(v.seq));
  check_view(fn, "value", v, s.batch, s.heads_kv, s.len_k, s.dim_v, "[B, Hk, Lk, Dv]", false);
  return s;
}

}  // namespace detail

/// How a backend's kernels use the arguments, where that changes the checks.
struct ValidateOptions {
  const char* fn = "attention_forward";  ///< the name errors start with
  /// false: the temperature and range arrays are in device memory (the CUDA
  /// backend checks their values there); here only their sizes and aliasing.
  bool host_arrays = true;
  /// The kernel forms c = scale / τ in float (check_temperature).
  bool fold_in_float = false;
};

namespace detail {

/// The checks both entry points share after the views: kernel, scale,
/// temperature values, visibility, threads.
template <class T, class Args>
double check_parameters(const Args& a, const AttentionShape& s, const ValidateOptions& opt) {
  const char* fn = opt.fn;
  if (a.kernel != Kernel::continuum && a.kernel != Kernel::softmax && a.kernel != Kernel::focal)
    fail(fn, "kernel: unknown value");
  const double scale = check_scale(fn, a.scale, s.dim, opt.fold_in_float);
  Visibility vis = a.visibility;
  const bool tau_array = a.temperature.shape != TemperatureShape::scalar;
  if (opt.host_arrays || !tau_array || (a.temperature.data == nullptr && temperature_count(a.temperature, s) > 0))
    check_temperature(fn, a.temperature, s, scale, opt.fold_in_float);
  if (!opt.host_arrays && vis.range_lo != nullptr && vis.range_hi != nullptr)
    vis.range_lo = vis.range_hi = nullptr;  // values checked on the device
  check_visibility(fn, vis, s);
  check_threads(fn, a.num_threads);
  return scale;
}

/// The regions of the arguments read by both passes besides the views: a
/// per-head / per-query temperature and the explicit ranges.
template <class Args>
void parameter_regions(const char* fn, const Args& a, const AttentionShape& s, Region& tau, Region& lo, Region& hi) {
  const bool tau_array = a.temperature.shape != TemperatureShape::scalar;
  tau = region_of(fn, "temperature.data", tau_array ? a.temperature.data : nullptr,
                  temperature_count(a.temperature, s));
  const index_t n = a.visibility.range_lo || a.visibility.range_hi ? s.batch * s.len_q : 0;
  lo = region_of(fn, "visibility.range_lo", a.visibility.range_lo, n);
  hi = region_of(fn, "visibility.range_hi", a.visibility.range_hi, n);
}

}  // namespace detail

/// Validates forward arguments (MATH.md §3, §8) for the kernels `opt` describes;
/// returns the resolved shape and the scale.
/// \throws std::invalid_argument naming the argument.
template <class T>
AttentionShape validate_forward(const ForwardArgs<T>& a, double* scale_out, const ValidateOptions& opt) {
  const char* fn = opt.fn;
  using namespace detail;
  const AttentionShape s = resolve_shape<T>(fn, a.query, a.key, a.value);
  check_view(fn, "out", a.out, s.batch, s.heads_q, s.len_q, s.dim_v, "[B, Hq, Lq, Dv]", true);
  const bool maps = a.probs != nullptr || a.cell_mass != nullptr;
  check_problem_size(fn, s, a.visibility.range_lo || a.visibility.range_hi, maps);
  const index_t rows = s.rows();
  const index_t cells = maps ? rows * s.len_k : 0;
  Region tau, lo, hi;
  parameter_regions(fn, a, s, tau, lo, hi);
  const Region reads[] = {region_of("query", a.query), region_of("key", a.key), region_of("value", a.value),
                          tau, lo, hi};
  const index_t stats = row_stats_count(fn, a.row_stats, s);
  const Region writes[] = {region_of("out", a.out), region_of(fn, "lse", a.lse, rows),
                           region_of(fn, "probs", a.probs, cells), region_of(fn, "cell_mass", a.cell_mass, cells),
                           region_of(fn, "row_stats.values", a.row_stats.values, stats),
                           region_of(fn, "row_stats.ref", a.row_stats.ref, stats > 0 ? rows : 0)};
  check_no_aliasing(fn, reads, writes);
  const double scale = check_parameters<T>(a, s, opt);
  if (scale_out) *scale_out = scale;
  return s;
}

namespace detail {
/// The CPU backend's choice of arithmetic: float32 is float storage's own
/// (rejected for double storage). No fold_in_float: a row whose scale / τ
/// overflows float is computed in double (backends/cpu.hpp).
template <class T>
ValidateOptions cpu_options(const char* fn, Compute compute) {
  if (compute != Compute::automatic && compute != Compute::float32 && compute != Compute::float64)
    fail(fn, "compute: not a Compute value (" + std::to_string(static_cast<int>(compute)) + ")");
  if (std::is_same<T, double>::value && compute == Compute::float32)
    fail(fn, "compute: float32 with double storage is not supported (double storage computes in double: "
             "Compute::automatic or Compute::float64)");
  ValidateOptions opt;
  opt.fn = fn;
  return opt;
}
}  // namespace detail

/// validate_forward for the CPU backend.
template <class T>
AttentionShape validate_forward(const ForwardArgs<T>& a, double* scale_out = nullptr) {
  return validate_forward(a, scale_out, detail::cpu_options<T>("attention_forward", a.compute));
}

/// Validates backward arguments (MATH.md §6) for the kernels `opt` describes;
/// returns the resolved shape and the scale.
/// \throws std::invalid_argument naming the argument.
template <class T>
AttentionShape validate_backward(const BackwardArgs<T>& a, double* scale_out, const ValidateOptions& opt) {
  const char* fn = opt.fn;
  using namespace detail;
  const AttentionShape s = resolve_shape<T>(fn, a.query, a.key, a.value);
  check_view(fn, "out", a.out, s.batch, s.heads_q, s.len_q, s.dim_v, "[B, Hq, Lq, Dv]", false);
  check_view(fn, "grad_out", a.grad_out, s.batch, s.heads_q, s.len_q, s.dim_v, "[B, Hq, Lq, Dv]", false);
  // Outputs: a view with null data is "not requested" and its shape ignored.
  if (a.grad_query.data)
    check_view(fn, "grad_query", a.grad_query, s.batch, s.heads_q, s.len_q, s.dim, "[B, Hq, Lq, D]", true);
  if (a.grad_key.data)
    check_view(fn, "grad_key", a.grad_key, s.batch, s.heads_kv, s.len_k, s.dim, "[B, Hk, Lk, D]", true);
  if (a.grad_value.data)
    check_view(fn, "grad_value", a.grad_value, s.batch, s.heads_kv, s.len_k, s.dim_v, "[B, Hk, Lk, Dv]", true);
  check_problem_size(fn, s, a.visibility.range_lo || a.visibility.range_hi, false);
  Region tau, lo, hi;
  parameter_regions(fn, a, s, tau, lo, hi);
  const index_t stats = row_stats_count(fn, a.row_stats, s);
  const Region reads[] = {region_of("query", a.query), region_of("key", a.key), region_of("value", a.value),
                          region_of("out", a.out), region_of("grad_out", a.grad_out),
                          region_of(fn, "lse", a.lse, s.rows()), tau, lo, hi,
                          region_of(fn, "row_stats.values", a.row_stats.values, stats),
                          region_of(fn, "row_stats.ref", a.row_stats.ref, stats > 0 ? s.rows() : 0)};
  const Region writes[] = {region_of("grad_query", a.grad_query), region_of("grad_key", a.grad_key),
                           region_of("grad_value", a.grad_value),
                           region_of(fn, "grad_temperature", a.grad_temperature, temperature_count(a.temperature, s))};
  check_no_aliasing(fn, reads, writes);
  const double scale = check_parameters<T>(a, s, opt);
  if (scale_out) *scale_out = scale;
  return s;
}

/// validate_backward for the CPU backend (see validate_forward).
template <class T>
AttentionShape validate_backward(const BackwardArgs<T>& a, double* scale_out = nullptr) {
  return validate_backward(a, scale_out, detail::cpu_options<T>("attention_backward", a.compute));
}

namespace detail {

/// A view with no element as the kernels get it: strides 0 and, when it is
/// an input, a non-null pointer, so that row() forms no offset (from null or
/// past the end) however its sizes and strides read. A null output stays
/// null (not requested).
template <class T>
void settle_if_empty(TensorView<T>& v) {
  static std::remove_const_t<T> nothing{};
  if (element_count(v) != 0) return;
  v.stride_batch = v.stride_head = v.stride_seq = 0;
  if (v.data == nullptr) v.data = &nothing;
}
/// Writes 0 to every element of a view (none when it is null or empty).
template <class T>
void fill_zero(const TensorView<T>& v) {
  if (v.data == nullptr || element_count(v) == 0) return;
  for (index_t b = 0; b < v.batch; ++b)
    for (index_t h = 0; h < v.heads; ++h)
      for (index_t s = 0; s < v.seq; ++s)
        for (index_t d = 0; d < v.dim; ++d) v.row(b, h, s)[d] = T(0);
}
template <class T>
ForwardArgs<T> settled(ForwardArgs<T> a) {
  settle_if_empty(a.query), settle_if_empty(a.key), settle_if_empty(a.value), settle_if_empty(a.out);
  return a;
}
template <class T>
BackwardArgs<T> settled(BackwardArgs<T> a) {
  settle_if_empty(a.query), settle_if_empty(a.key), settle_if_empty(a.value), settle_if_empty(a.out);
  settle_if_empty(a.grad_out);
  for (TensorView<T>* g : {&a.grad_query, &a.grad_key, &a.grad_value})
    if (g->data != nullptr) settle_if_empty(*g);
  return a;
}

}  // namespace detail

}  // namespace continuum
