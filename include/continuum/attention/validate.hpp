// attention/validate.hpp — argument checks shared by every backend (host only).
// Every violation throws std::invalid_argument naming the function, the
// argument and the expected shape or range.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "params.hpp"

namespace continuum {

/// Problem sizes resolved from validated arguments.
struct AttentionShape {
  index_t batch = 0, heads_q = 0, heads_kv = 0, len_q = 0, len_k = 0, dim = 0, dim_v = 0;
  index_t group() const { return heads_kv > 0 ? heads_q / heads_kv : 0; }
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

template <class T>
index_t element_count(const TensorView<T>& v) {
  return v.batch * v.heads * v.seq * v.dim;
}

/// Byte range [first, last) that a view touches (empty when it has no element).
struct Span {
  std::uintptr_t first = 0, last = 0;
  bool empty() const { return last <= first; }
};
template <class T>
Span span_of(const TensorView<T>& v) {
  if (v.data == nullptr || element_count(v) == 0) return {};
  const index_t far = (v.batch - 1) * v.stride_batch + (v.heads - 1) * v.stride_head +
                      (v.seq - 1) * v.stride_seq + (v.dim - 1);
  const auto p = reinterpret_cast<std::uintptr_t>(v.data);
  return {p, p + static_cast<std::uintptr_t>(far + 1) * sizeof(T)};
}
template <class T>
Span span_of(const T* p, index_t n) {
  if (p == nullptr || n <= 0) return {};
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  return {a, a + static_cast<std::uintptr_t>(n) * sizeof(T)};
}
inline bool overlap(Span a, Span b) {
  return !a.empty() && !b.empty() && a.first < b.last && b.first < a.last;
}

/// Checks one view: expected sizes, non-negative strides, unit dim stride,
/// non-null data when it has elements, and (for outputs) that no two
/// elements share memory.
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
    fail(fn, std::string(name) + ": strides must be >= 0, got (" + std::to_string(v.stride_batch) +
                 ", " + std::to_string(v.stride_head) + ", " + std::to_string(v.stride_seq) + ", 1)");
  {  // every offset and the element count must fit in index_t (no wrap-around)
    constexpr index_t big = std::numeric_limits<index_t>::max();
    const index_t n[4] = {v.batch, v.heads, v.seq, v.dim};
    const index_t st[4] = {v.stride_batch, v.stride_head, v.stride_seq, 1};
    const bool any_empty = n[0] == 0 || n[1] == 0 || n[2] == 0 || n[3] == 0;
    index_t far = 0, count = 1;
    for (int a = 0; a < 4 && !any_empty; ++a) {
      if (n[a] > 1 && st[a] > (big - far) / (n[a] - 1)) far = -1;
      if (far >= 0) far += st[a] * (n[a] - 1);
      if (count > big / n[a]) count = -1;
      if (count >= 0) count *= n[a];
      if (far < 0 || count < 0)
        fail(fn, std::string(name) + ": shape " + shape_str(v) + " with strides (" +
                     std::to_string(v.stride_batch) + ", " + std::to_string(v.stride_head) + ", " +
                     std::to_string(v.stride_seq) + ", 1) overflows a 64-bit element offset");
    }
  }
  if (v.data == nullptr && element_count(v) != 0)
    fail(fn, std::string(name) + ": data is null but the shape " + shape_str(v) + " is not empty");
  if (is_output && element_count(v) != 0) {
    // Injective layout: sort the non-trivial axes by stride; each stride must
    // reach past everything the smaller axes span.
    index_t sz[3] = {v.batch, v.heads, v.seq};
    index_t st[3] = {v.stride_batch, v.stride_head, v.stride_seq};
    for (int a = 0; a < 3; ++a)
      for (int c = a + 1; c < 3; ++c)
        if (st[c] < st[a]) {
          index_t t = st[a]; st[a] = st[c]; st[c] = t;
          t = sz[a]; sz[a] = sz[c]; sz[c] = t;
        }
    index_t extent = v.dim;
    for (int a = 0; a < 3; ++a) {
      if (sz[a] <= 1) continue;
      if (st[a] < extent)
        fail(fn, std::string(name) + ": output view overlaps itself (strides " +
                     std::to_string(v.stride_batch) + ", " + std::to_string(v.stride_head) + ", " +
                     std::to_string(v.stride_seq) + " for shape " + shape_str(v) + ")");
      extent = st[a] * (sz[a] - 1) + extent;
    }
  }
}

template <class T>
void check_temperature(const char* fn, const Temperature<T>& t, const AttentionShape& s, double scale) {
  // where < 0: the scalar; otherwise a flat index into the per-head or
  // per-query array (the message is built only on failure).
  auto check_one = [&](T tau, index_t where) {
    const bool bad_value = !(tau > T(0)) || !std::isfinite(static_cast<double>(tau));
    const bool overflow = !bad_value && !std::isfinite(scale / static_cast<double>(tau));
    if (!bad_value && !overflow) return;
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
    fail(fn, name + ": too small, scale / temperature = " + num(scale) + " / " +
                 num(static_cast<double>(tau)) + " overflows");
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
      const index_t n = s.batch * s.heads_q * s.len_q;
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

inline double check_scale(const char* fn, const std::optional<double>& scale, index_t dim) {
  if (!scale) {
    if (dim < 1) fail(fn, "scale: the default 1/sqrt(head_dim) needs head_dim >= 1, got " + std::to_string(dim));
    return 1.0 / std::sqrt(static_cast<double>(dim));
  }
  if (!(*scale > 0.0) || !std::isfinite(*scale))
    fail(fn, "scale: must be finite and > 0, got " + num(*scale));
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
  check_view(fn, "value", v, s.batch, s.heads_kv, s.len_k, s.dim_v, "[B, Hk, Lk, Dv]", false);
  return s;
}

}  // namespace detail

/// Validates forward arguments (SPEC §3, §8); returns the resolved shape and
/// the scale. \throws std::invalid_argument naming the argument.
template <class T>
AttentionShape validate_forward(const ForwardArgs<T>& a, double* scale_out = nullptr) {
  const char* fn = "attention_forward";
  using namespace detail;
  const AttentionShape s = resolve_shape<T>(fn, a.query, a.key, a.value);
  check_view(fn, "out", a.out, s.batch, s.heads_q, s.len_q, s.dim_v, "[B, Hq, Lq, Dv]", true);
  const index_t rows = s.batch * s.heads_q * s.len_q;
  const index_t maps = rows * s.len_k;
  const Span in[] = {span_of(a.query), span_of(a.key), span_of(a.value)};
  const Span outs[] = {span_of(a.out), span_of(a.lse, rows), span_of(a.probs, maps),
                       span_of(a.cell_mass, maps)};
  const char* out_names[] = {"out", "lse", "probs", "cell_mass"};
  for (int o = 0; o < 4; ++o) {
    for (const Span& i : in)
      if (overlap(outs[o], i)) fail(fn, std::string(out_names[o]) + ": aliases an input (query/key/value)");
    for (int p = 0; p < o; ++p)
      if (overlap(outs[o], outs[p]))
        fail(fn, std::string(out_names[o]) + ": aliases " + out_names[p]);
  }
  if (a.kernel != Kernel::continuum && a.kernel != Kernel::softmax && a.kernel != Kernel::focal)
    fail(fn, "kernel: unknown value");
  const double scale = check_scale(fn, a.scale, s.dim);
  check_temperature(fn, a.temperature, s, scale);
  check_visibility(fn, a.visibility, s);
  check_threads(fn, a.num_threads);
  if (scale_out) *scale_out = scale;
  return s;
}

/// Validates backward arguments (SPEC §6); returns the resolved shape and the
/// scale. \throws std::invalid_argument naming the argument.
template <class T>
AttentionShape validate_backward(const BackwardArgs<T>& a, double* scale_out = nullptr) {
  const char* fn = "attention_backward";
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
  const index_t rows = s.batch * s.heads_q * s.len_q;
  index_t ntau = 1;
  if (a.temperature.shape == TemperatureShape::per_head) ntau = s.heads_q;
  if (a.temperature.shape == TemperatureShape::per_query) ntau = rows;
  const Span in[] = {span_of(a.query), span_of(a.key), span_of(a.value), span_of(a.out),
                     span_of(a.grad_out), span_of(a.lse, rows),
                     span_of(a.temperature.shape == TemperatureShape::scalar ? nullptr : a.temperature.data, ntau)};
  const Span outs[] = {span_of(a.grad_query), span_of(a.grad_key), span_of(a.grad_value),
                       span_of(a.grad_temperature, ntau)};
  const char* out_names[] = {"grad_query", "grad_key", "grad_value", "grad_temperature"};
  for (int o = 0; o < 4; ++o) {
    for (const Span& i : in)
      if (overlap(outs[o], i))
        fail(fn, std::string(out_names[o]) + ": aliases an input (query/key/value/out/grad_out/lse/temperature)");
    for (int p = 0; p < o; ++p)
      if (overlap(outs[o], outs[p])) fail(fn, std::string(out_names[o]) + ": aliases " + out_names[p]);
  }
  if (a.kernel != Kernel::continuum && a.kernel != Kernel::softmax && a.kernel != Kernel::focal)
    fail(fn, "kernel: unknown value");
  const double scale = check_scale(fn, a.scale, s.dim);
  check_temperature(fn, a.temperature, s, scale);
  check_visibility(fn, a.visibility, s);
  check_threads(fn, a.num_threads);
  if (scale_out) *scale_out = scale;
  return s;
}

}  // namespace continuum
