// ops.cpp — PyTorch operators over the header-only library (issue 10).
//
// Registers, with TORCH_LIBRARY, two operators in the namespace `continuum`:
//   continuum::forward  -> (out [B,Hq,Lq,Dv], lse [B,Hq,Lq], and with row_stats=True
//                           the CPU forward's row statistics for the backward,
//                           [B,Hq,Lq,Dv+5] and int64 [B,Hq,Lq]; 0 elements otherwise)
//   continuum::backward -> (dq, dk, dv, dtemperature)
// and their CPU kernels, which call continuum::attention_forward /
// attention_backward on strided views of the tensors' own memory (no copies
// of query/key/value; only the last axis must be contiguous), and their
// autograd (below: backward is forward's gradient, in C++). The Python
// package (continuum_attention/_ops.py) adds the fake (meta) kernels.
//
// Both take a trailing `str compute="default"` (a schema default: callers that
// stop after `scale` keep working): "default" computes in the storage type's
// own precision (CPU float32: float arithmetic; float64: double), "float32" in
// float, "float64" in double with each output rounded once (CPU only). The
// library's one tiled kernel family runs in every case. See parse_compute.
//
// Errors: the library's std::invalid_argument (naming the argument and the
// expected shape) and our own argument checks are raised as c10::ValueError,
// which Python sees as ValueError. Inputs are never written.
#include <Python.h>  // only for the module init stub at the bottom

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <continuum/continuum.hpp>

#if defined(CONTINUUM_ATTENTION_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda_entry.hpp"
#endif

#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

namespace continuum_torch {
namespace {

using at::Tensor;
using continuum::index_t;

constexpr const char* kWho = "continuum_attention";

/// The library's accum_t: lse, a tensor temperature and dτ are float for the
/// 16-bit storage types (CPU and CUDA), the storage type otherwise.
at::ScalarType accum_type(at::ScalarType st) {
  return st == at::kHalf || st == at::kBFloat16 ? at::kFloat : st;
}

continuum::Kernel parse_kernel(std::string_view name) {
  if (name == "continuum") return continuum::Kernel::continuum;
  if (name == "softmax") return continuum::Kernel::softmax;
  if (name == "focal") return continuum::Kernel::focal;
  TORCH_CHECK_VALUE(false, kWho, ": kernel must be \"continuum\", \"softmax\" or \"focal\", got \"",
                    std::string(name), "\"");
}

/// The `compute` argument of both operators: the library's Compute
/// (include/continuum/attention/params.hpp). "default" is the storage type's
/// own precision (float32 storage computes in float, float64 in double);
/// "float32" asks for float arithmetic (float32, bfloat16 or float16 storage
/// on the CPU; not float64 storage);
/// "float64" for double arithmetic with each output rounded once (CPU only).
/// On CUDA (float accumulation always) it validates only.
continuum::Compute parse_compute(std::string_view compute, at::ScalarType st, bool cuda) {
  const bool is_default = compute == "default", f32 = compute == "float32",
             f64 = compute == "float64";
  TORCH_CHECK_VALUE(is_default || f32 || f64, kWho,
                    ": compute must be None, \"default\", \"float32\" or \"float64\", got \"",
                    std::string(compute), "\"");
  if (cuda) {
    TORCH_CHECK_VALUE(!f64, kWho,
                      ": compute=\"float64\" is not available on CUDA (the CUDA backend "
                      "accumulates in float32); use compute=\"default\" or \"float32\"");
    return continuum::Compute::automatic;
  }
  TORCH_CHECK_VALUE(!(f32 && st == at::kDouble), kWho, ": compute=\"float32\" needs float32, "
                    "bfloat16 or float16 storage, query is ", st, " (float64 storage computes in float64: use "
                    "compute=\"default\" or \"float64\")");
  if (f64) return continuum::Compute::float64;
  return f32 ? continuum::Compute::float32 : continuum::Compute::automatic;
}

void check_tensor(const Tensor& t, const char* name, int64_t rank, const Tensor& query) {
  TORCH_CHECK_VALUE(t.defined(), kWho, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.dim() == rank, kWho, ": ", name, " must have ", rank, " dimensions, got ",
                    t.dim(), " (shape ", t.sizes(), ")");
  TORCH_CHECK_VALUE(t.device() == query.device(), kWho, ": ", name, " is on ", t.device(),
                    " but query is on ", query.device(), " (all tensors must be on one device)");
  TORCH_CHECK_VALUE(t.scalar_type() == query.scalar_type(), kWho, ": ", name, " has dtype ",
                    t.scalar_type(), " but query has ", query.scalar_type(),
                    " (query, key, value, grad and a tensor temperature share one dtype)");
}

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, bool cuda = false) {
  TORCH_CHECK_VALUE(q.defined(), kWho, ": query is undefined");
  TORCH_CHECK_VALUE(q.dim() == 4, kWho, ": query must be [B, Hq, Lq, D] (4 dimensions), got ",
                    q.dim(), " (shape ", q.sizes(), ")");
  const auto st = q.scalar_type();
  if (!cuda) {
    TORCH_CHECK_VALUE(q.device().is_cpu(), kWho, ": this kernel runs on the CPU, query is on ",
                      q.device());
    TORCH_CHECK_VALUE(st == at::kFloat || st == at::kDouble || st == at::kBFloat16 || st == at::kHalf, kWho,
                      ": the CPU backend supports float32, float64, bfloat16 and float16, got ", st);
  } else {
    TORCH_CHECK_VALUE(q.device().is_cuda(), kWho, ": this kernel runs on CUDA, query is on ",
                      q.device());
    TORCH_CHECK_VALUE(st == at::kFloat || st == at::kHalf || st == at::kBFloat16, kWho,
                      ": the CUDA backend supports float32, float16 and bfloat16, got ", st);
  }
  check_tensor(k, "key", 4, q);
  check_tensor(v, "value", 4, q);
}

/// A view of `t` ([B, H, L, D]) for the library; strides copied as they are
/// (the library rejects a non-unit last stride with its own message). A
/// length-1 last axis has no meaningful stride in PyTorch: use 1.
/// The library's storage type for a PyTorch element type: the same bits
/// (c10::BFloat16 and continuum::bfloat16 are both bfloat16, c10::Half and
/// continuum::float16 both IEEE binary16).
template <class T>
struct storage {
  using type = T;
};
template <>
struct storage<c10::BFloat16> {
  using type = continuum::bfloat16;
};
template <>
struct storage<c10::Half> {
  using type = continuum::float16;
};
template <class T>
using storage_t = typename storage<T>::type;
static_assert(sizeof(c10::BFloat16) == sizeof(continuum::bfloat16), "bfloat16 layouts differ");
static_assert(sizeof(c10::Half) == sizeof(continuum::float16), "float16 layouts differ");

/// The strides the library sees for t ([B, H, L, D]): t's own, with 1 for a
/// length-1 last axis, and a contiguous tensor's for a tensor without
/// elements, whose strides address nothing (autograd hands `.sum()`'s
/// gradient of an empty output in expanded, with stride 0).
std::array<int64_t, 4> strides_of(const Tensor& t) {
  if (t.numel() == 0) return {t.size(1) * t.size(2) * t.size(3), t.size(2) * t.size(3), t.size(3), 1};
  return {t.stride(0), t.stride(1), t.stride(2), t.size(3) == 1 ? 1 : t.stride(3)};
}

template <class T>
continuum::TensorView<T> view(const Tensor& t) {
  const std::array<int64_t, 4> s = strides_of(t);
  return {static_cast<T*>(t.data_ptr()), t.size(0), t.size(1), t.size(2), t.size(3), s[0], s[1], s[2], s[3]};
}

/// Everything that is not a tensor being differentiated: resolved once,
/// shared by the forward and the backward.
struct Options {
  continuum::Kernel kernel = continuum::Kernel::continuum;
  continuum::Visibility vis{};
  Tensor range_lo, range_hi;  // int64, contiguous [B, Lq], kept alive here
  Tensor temperature;         // contiguous, or undefined for a number
  double temperature_value = 1.0;
  continuum::TemperatureShape temperature_shape = continuum::TemperatureShape::scalar;
  std::optional<double> scale;
};

Tensor ranges_as_int64(const std::optional<Tensor>& r, const char* name, const Tensor& q) {
  const Tensor& t = *r;
  TORCH_CHECK_VALUE(t.device() == q.device(), kWho, ": ", name, " is on ", t.device(),
                    " but query is on ", q.device());
  TORCH_CHECK_VALUE(!at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type()) &&
                        t.scalar_type() != at::kBool,
                    kWho, ": ", name, " must be an integer tensor, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == q.size(0) && t.size(1) == q.size(2), kWho, ": ",
                    name, " must have shape [B, Lq] = [", q.size(0), ", ", q.size(2), "], got ",
                    t.sizes());
  return t.to(at::kLong).contiguous();  // a small index tensor; copied only if needed
}

Options make_options(const Tensor& q, std::string_view kernel, bool causal, int64_t window_left,
                     int64_t window_right, const std::optional<Tensor>& range_lo,
                     const std::optional<Tensor>& range_hi,
                     const std::optional<Tensor>& temperature, double temperature_value,
                     std::optional<double> scale) {
  Options o;
  o.kernel = parse_kernel(kernel);
  o.vis.causal = causal;
  o.vis.window_left = window_left;  // MATH.md §3: negative = unlimited on that side
  o.vis.window_right = window_right;
  TORCH_CHECK_VALUE(range_lo.has_value() == range_hi.has_value(), kWho,
                    ": ranges: give both lo and hi ([B, Lq] integer tensors) or neither");
  if (range_lo) {
    o.range_lo = ranges_as_int64(range_lo, "ranges[0] (lo)", q);
    o.range_hi = ranges_as_int64(range_hi, "ranges[1] (hi)", q);
    o.vis.range_lo = o.range_lo.data_ptr<int64_t>();
    o.vis.range_hi = o.range_hi.data_ptr<int64_t>();
  }
  if (temperature) {
    const Tensor& t = *temperature;
    TORCH_CHECK_VALUE(t.device() == q.device(), kWho, ": temperature is on ", t.device(),
                      " but query is on ", q.device());
    TORCH_CHECK_VALUE(t.scalar_type() == accum_type(q.scalar_type()), kWho,
                      ": temperature has dtype ", t.scalar_type(), "; with a ", q.scalar_type(),
                      " query a tensor temperature must be ", accum_type(q.scalar_type()),
                      " (the query's dtype, float32 for bfloat16 and float16 queries)");
    const int64_t B = q.size(0), Hq = q.size(1), Lq = q.size(2);
    if (t.dim() == 0) {
      o.temperature_shape = continuum::TemperatureShape::scalar;
    } else if (t.dim() == 1 && t.size(0) == Hq) {
      o.temperature_shape = continuum::TemperatureShape::per_head;
    } else if (t.dim() == 3 && t.size(0) == B && t.size(1) == Hq && t.size(2) == Lq) {
      o.temperature_shape = continuum::TemperatureShape::per_query;
    } else {
      TORCH_CHECK_VALUE(false, kWho, ": temperature must be a number, a 0-d tensor, [Hq] = [", Hq,
                        "] or [B, Hq, Lq] = [", B, ", ", Hq, ", ", Lq, "], got shape ", t.sizes());
    }
    o.temperature = t.contiguous();
    if (o.temperature_shape == continuum::TemperatureShape::scalar)
      o.temperature_value = o.temperature.item<double>();
  } else {
    o.temperature_value = temperature_value;
    // A number the call's float32 temperature (16-bit and float32 queries)
    // cannot hold is named as given, not as the 0 or inf it would round to.
    // (Non-positive and non-finite numbers: the library's own check.)
    const float f = static_cast<float>(temperature_value);
    TORCH_CHECK_VALUE(accum_type(q.scalar_type()) != at::kFloat || !(std::isfinite(temperature_value) &&
                                                                     temperature_value > 0) ||
                          (std::isfinite(f) && f > 0),
                      kWho, ": temperature ", temperature_value, " is outside float32's range (",
                      std::numeric_limits<float>::denorm_min(), " to ", std::numeric_limits<float>::max(),
                      "): with a ", q.scalar_type(), " query the temperature is float32",
                      q.device().is_cpu() ? "; float64 inputs have a float64 one" : "");
  }
  o.scale = scale;
  return o;
}

template <class T>
continuum::Temperature<T> temperature_of(const Options& o) {
  continuum::Temperature<T> t;
  t.shape = o.temperature_shape;
  t.value = static_cast<T>(o.temperature_value);
  if (o.temperature.defined() && t.shape != continuum::TemperatureShape::scalar)
    t.data = o.temperature.data_ptr<T>();
  return t;
}

/// Runs `f`, turning the library's std::invalid_argument into a ValueError.
template <class F>
void call_library(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

std::tuple<Tensor, Tensor, Tensor, Tensor> forward_cpu(const Tensor& query, const Tensor& key, const Tensor& value,
                                                       c10::string_view kernel, bool causal, int64_t window_left,
                                                       int64_t window_right,
                                                       const std::optional<Tensor>& range_lo,
                                                       const std::optional<Tensor>& range_hi,
                                                       const std::optional<Tensor>& temperature,
                                                       double temperature_value, std::optional<double> scale,
                                                       c10::string_view compute, bool row_stats) {
  check_qkv(query, key, value);
  const continuum::Compute compute_type = parse_compute(std::string_view(compute.data(), compute.size()),
                                              query.scalar_type(), /*cuda=*/false);
  const Options o = make_options(query, std::string_view(kernel.data(), kernel.size()), causal,
                                 window_left, window_right, range_lo, range_hi, temperature,
                                 temperature_value, scale);
  const int64_t B = query.size(0), Hq = query.size(1), Lq = query.size(2), Dv = value.size(3);
  Tensor out = at::empty({B, Hq, Lq, Dv}, query.options());
  Tensor lse = at::empty({B, Hq, Lq}, query.options().dtype(accum_type(query.scalar_type())));
  // The row statistics for the backward (continuum::RowStats), when asked for.
  Tensor stats = row_stats ? at::empty({B, Hq, Lq, continuum::row_stats_width(Dv)}, lse.options())
                           : at::empty({0}, lse.options());
  Tensor ref = at::empty({row_stats ? B * Hq * Lq : 0}, lse.options().dtype(at::kLong));
  if (row_stats) ref = ref.view({B, Hq, Lq});
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "continuum::forward", [&] {
    using E = storage_t<scalar_t>;
    using A = continuum::accum_t<E>;
    continuum::ForwardArgs<E> a;
    a.query = view<const E>(query);
    a.key = view<const E>(key);
    a.value = view<const E>(value);
    a.out = view<E>(out);
    a.lse = lse.data_ptr<A>();
    if (row_stats) a.row_stats = {stats.data_ptr<A>(), ref.data_ptr<int64_t>()};
    a.kernel = o.kernel;
    a.temperature = temperature_of<A>(o);
    a.scale = o.scale;
    a.visibility = o.vis;
    a.compute = compute_type;
    a.num_threads = at::get_num_threads();  // results do not depend on it
    call_library([&] { continuum::attention_forward(continuum::cpu, a); });
  });
  return {out, lse, stats, ref};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> backward_cpu(
    const Tensor& grad_out_in, const Tensor& query, const Tensor& key, const Tensor& value,
    const Tensor& out, const Tensor& lse, const Tensor& row_stats, const Tensor& row_ref,
    c10::string_view kernel, bool causal,
    int64_t window_left, int64_t window_right, const std::optional<Tensor>& range_lo,
    const std::optional<Tensor>& range_hi, const std::optional<Tensor>& temperature,
    double temperature_value, std::optional<double> scale, c10::string_view compute) {
  check_qkv(query, key, value);
  check_tensor(out, "out", 4, query);
  check_tensor(grad_out_in, "grad_out", 4, query);
  TORCH_CHECK_VALUE(lse.defined() && lse.dim() == 3 && lse.size(0) == query.size(0) &&
                        lse.size(1) == query.size(1) && lse.size(2) == query.size(2) &&
                        lse.device() == query.device() && lse.scalar_type() == accum_type(query.scalar_type()),
                    kWho, ": lse must be the forward's [B, Hq, Lq] = [", query.size(0), ", ", query.size(1), ", ",
                    query.size(2), "] ", accum_type(query.scalar_type()), " tensor on ", query.device(), ", got ",
                    lse.defined() ? lse.sizes() : at::IntArrayRef{}, " ", lse.defined() ? lse.scalar_type() : at::kFloat);
  const continuum::Compute compute_type = parse_compute(std::string_view(compute.data(), compute.size()),
                                              query.scalar_type(), /*cuda=*/false);
  // The forward's row statistics, or none (0 elements).
  const bool have_stats = row_stats.numel() > 0;
  if (have_stats) {
    const int64_t B = query.size(0), Hq = query.size(1), Lq = query.size(2);
    TORCH_CHECK_VALUE(row_stats.dim() == 4 && row_stats.size(0) == B && row_stats.size(1) == Hq &&
                          row_stats.size(2) == Lq && row_stats.size(3) == continuum::row_stats_width(value.size(3)) &&
                          row_stats.scalar_type() == lse.scalar_type() && row_stats.device() == query.device() &&
                          row_ref.dim() == 3 && row_ref.size(0) == B && row_ref.size(1) == Hq &&
                          row_ref.size(2) == Lq && row_ref.scalar_type() == at::kLong &&
                          row_ref.device() == query.device(),
                      kWho, ": row_stats and row_ref must be the forward's [B, Hq, Lq, Dv + 5] and [B, Hq, Lq]");
  }
  const Tensor stats_c = have_stats ? row_stats.contiguous() : row_stats;
  const Tensor ref_c = have_stats ? row_ref.contiguous() : row_ref;
  // Autograd hands in expanded (stride-0) or transposed gradients; the library
  // needs a contiguous last axis, so make one for dO (ours, not the user's).
  const Tensor grad_out =
      grad_out_in.size(3) > 1 && grad_out_in.stride(3) != 1 ? grad_out_in.contiguous() : grad_out_in;
  const Options o = make_options(query, std::string_view(kernel.data(), kernel.size()), causal,
                                 window_left, window_right, range_lo, range_hi, temperature,
                                 temperature_value, scale);
  Tensor dq = at::empty(query.sizes(), query.options());
  Tensor dk = at::empty(key.sizes(), key.options());
  Tensor dv = at::empty(value.sizes(), value.options());
  const auto acc = query.options().dtype(accum_type(query.scalar_type()));
  Tensor dt = o.temperature.defined() ? at::empty(o.temperature.sizes(), acc) : at::empty({0}, acc);
  const Tensor lse_c = lse.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "continuum::backward", [&] {
    using E = storage_t<scalar_t>;
    using A = continuum::accum_t<E>;
    continuum::BackwardArgs<E> a;
    a.query = view<const E>(query);
    a.key = view<const E>(key);
    a.value = view<const E>(value);
    a.out = view<const E>(out);
    a.grad_out = view<const E>(grad_out);
    a.lse = lse_c.data_ptr<A>();
    if (have_stats) a.row_stats = continuum::RowStats<const A>{stats_c.data_ptr<A>(), ref_c.data_ptr<int64_t>()};
    a.grad_query = view<E>(dq);
    a.grad_key = view<E>(dk);
    a.grad_value = view<E>(dv);
    a.grad_temperature = o.temperature.defined() ? dt.data_ptr<A>() : nullptr;
    a.kernel = o.kernel;
    a.temperature = temperature_of<A>(o);
    a.scale = o.scale;
    a.visibility = o.vis;
    a.compute = compute_type;
    a.num_threads = at::get_num_threads();
    call_library([&] { continuum::attention_backward(continuum::cpu, a); });
  });
  return {dq, dk, dv, dt};
}


#if defined(CONTINUUM_ATTENTION_WITH_CUDA)
namespace ce = cuda_entry;

ce::View raw_view(const Tensor& t) {
  const std::array<int64_t, 4> s = strides_of(t);
  return {t.data_ptr(), t.size(0), t.size(1), t.size(2), t.size(3), s[0], s[1], s[2], s[3]};
}

ce::Common raw_common(const Tensor& q, const Options& o) {
  ce::Common c;
  const auto st = q.scalar_type();
  c.storage = st == at::kHalf ? ce::Storage::f16 : st == at::kBFloat16 ? ce::Storage::bf16 : ce::Storage::f32;
  c.kernel = o.kernel;
  c.visibility = o.vis;
  c.temperature_shape = o.temperature_shape;
  c.temperature_value = static_cast<float>(o.temperature_value);
  if (o.temperature.defined() && o.temperature_shape != continuum::TemperatureShape::scalar)
    c.temperature_data = o.temperature.data_ptr<float>();
  c.has_scale = o.scale.has_value();
  c.scale = o.scale.value_or(0.0);
  c.stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  return c;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> forward_cuda(const Tensor& query, const Tensor& key, const Tensor& value,
                                                        c10::string_view kernel, bool causal, int64_t window_left,
                                                        int64_t window_right,
                                                        const std::optional<Tensor>& range_lo,
                                                        const std::optional<Tensor>& range_hi,
                                                        const std::optional<Tensor>& temperature,
                                                        double temperature_value, std::optional<double> scale,
                                                        c10::string_view compute, bool /*row_stats: CPU only*/) {
  check_qkv(query, key, value, /*cuda=*/true);
  parse_compute(std::string_view(compute.data(), compute.size()), query.scalar_type(), /*cuda=*/true);
  const c10::cuda::CUDAGuard guard(query.device());
  const Options o = make_options(query, std::string_view(kernel.data(), kernel.size()), causal,
                                 window_left, window_right, range_lo, range_hi, temperature,
                                 temperature_value, scale);
  const int64_t B = query.size(0), Hq = query.size(1), Lq = query.size(2), Dv = value.size(3);
  Tensor out = at::empty({B, Hq, Lq, Dv}, query.options());
  Tensor lse = at::empty({B, Hq, Lq}, query.options().dtype(at::kFloat));
  ce::Forward f;
  f.c = raw_common(query, o);
  f.query = raw_view(query);
  f.key = raw_view(key);
  f.value = raw_view(value);
  f.out = raw_view(out);
  f.lse = lse.data_ptr<float>();
  call_library([&] { ce::forward(f); });
  // (no row statistics: the CUDA backward computes its own)
  return {out, lse, at::empty({0}, lse.options()), at::empty({0}, lse.options().dtype(at::kLong))};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> backward_cuda(
    const Tensor& grad_out_in, const Tensor& query, const Tensor& key, const Tensor& value,
    const Tensor& out, const Tensor& lse, const Tensor& /*row_stats*/, const Tensor& /*row_ref*/,
    c10::string_view kernel, bool causal,
    int64_t window_left, int64_t window_right, const std::optional<Tensor>& range_lo,
    const std::optional<Tensor>& range_hi, const std::optional<Tensor>& temperature,
    double temperature_value, std::optional<double> scale, c10::string_view compute) {
  check_qkv(query, key, value, /*cuda=*/true);
  parse_compute(std::string_view(compute.data(), compute.size()), query.scalar_type(), /*cuda=*/true);
  check_tensor(out, "out", 4, query);
  check_tensor(grad_out_in, "grad_out", 4, query);
  TORCH_CHECK_VALUE(lse.defined() && lse.dim() == 3 && lse.size(0) == query.size(0) &&
                        lse.size(1) == query.size(1) && lse.size(2) == query.size(2) &&
                        lse.scalar_type() == at::kFloat && lse.device() == query.device(),
                    kWho, ": lse must be the forward's float32 [B, Hq, Lq] = [", query.size(0), ", ",
                    query.size(1), ", ", query.size(2), "] on the query's device");
  const c10::cuda::CUDAGuard guard(query.device());
  const Tensor grad_out =
      grad_out_in.size(3) > 1 && grad_out_in.stride(3) != 1 ? grad_out_in.contiguous() : grad_out_in;
  const Options o = make_options(query, std::string_view(kernel.data(), kernel.size()), causal,
                                 window_left, window_right, range_lo, range_hi, temperature,
                                 temperature_value, scale);
  Tensor dq = at::empty(query.sizes(), query.options());
  Tensor dk = at::empty(key.sizes(), key.options());
  Tensor dv = at::empty(value.sizes(), value.options());
  const auto acc = query.options().dtype(at::kFloat);
  Tensor dt = o.temperature.defined() ? at::empty(o.temperature.sizes(), acc) : at::empty({0}, acc);
  const Tensor lse_c = lse.contiguous();
  ce::Backward b;
  b.c = raw_common(query, o);
  b.query = raw_view(query);
  b.key = raw_view(key);
  b.value = raw_view(value);
  b.out = raw_view(out);
  b.grad_out = raw_view(grad_out);
  b.grad_query = raw_view(dq);
  b.grad_key = raw_view(dk);
  b.grad_value = raw_view(dv);
  b.lse = lse_c.data_ptr<float>();
  b.grad_temperature = o.temperature.defined() ? dt.data_ptr<float>() : nullptr;
  call_library([&] { ce::backward(b); });
  return {dq, dk, dv, dt};
}
#endif  // CONTINUUM_ATTENTION_WITH_CUDA

// ---------------------------------------------------------------------------
// Autograd: the library's analytic backward (MATH.md §6) as the forward's
// gradient, at the Autograd dispatch key, in C++. Each function calls its
// operator again below autograd (the CPU or CUDA kernel, or under
// torch.compile the fake one), so the same registration serves every device
// and tracing. (With torch.library.register_autograd in Python, a
// differentiable call spent about 50 µs in PyTorch's wrapper alone, filling in
// the schema's defaults argument by argument: docs/PERFORMANCE.md.)
// ---------------------------------------------------------------------------
using Four = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Four forward_below_autograd(const Tensor& query, const Tensor& key, const Tensor& value, c10::string_view kernel,
                            bool causal, int64_t window_left, int64_t window_right,
                            const std::optional<Tensor>& range_lo, const std::optional<Tensor>& range_hi,
                            const std::optional<Tensor>& temperature, double temperature_value,
                            std::optional<double> scale, c10::string_view compute, bool row_stats) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("continuum::forward", "")
          .typed<Four(const Tensor&, const Tensor&, const Tensor&, c10::string_view, bool, int64_t, int64_t,
                      const std::optional<Tensor>&, const std::optional<Tensor>&, const std::optional<Tensor>&,
                      double, std::optional<double>, c10::string_view, bool)>();
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(query, key, value, kernel, causal, window_left, window_right, range_lo, range_hi, temperature,
                 temperature_value, scale, compute, row_stats);
}

Four backward_below_autograd(const Tensor& grad_out, const Tensor& query, const Tensor& key, const Tensor& value,
                             const Tensor& out, const Tensor& lse, const Tensor& row_stats, const Tensor& row_ref,
                             c10::string_view kernel, bool causal, int64_t window_left, int64_t window_right,
                             const std::optional<Tensor>& range_lo, const std::optional<Tensor>& range_hi,
                             const std::optional<Tensor>& temperature, double temperature_value,
                             std::optional<double> scale, c10::string_view compute) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("continuum::backward", "")
          .typed<Four(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&, const Tensor&, c10::string_view, bool, int64_t, int64_t,
                      const std::optional<Tensor>&, const std::optional<Tensor>&, const std::optional<Tensor>&,
                      double, std::optional<double>, c10::string_view)>();
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(grad_out, query, key, value, out, lse, row_stats, row_ref, kernel, causal, window_left,
                 window_right, range_lo, range_hi, temperature, temperature_value, scale, compute);
}

// Forward-mode AD (torch.func.jvp / jacfwd, torch.autograd.forward_ad's dual
// tensors) has no rule here: the operator's tangent (a JVP) is not derived
// (MATH.md §6 gives the backward only). Without this check a dual input's
// tangent would be dropped and jacfwd would return zeros without a word.
void reject_forward_ad(const char* op, std::initializer_list<Tensor> inputs) {
  for (const Tensor& t : inputs)
    TORCH_CHECK_NOT_IMPLEMENTED(!t.defined() || !t._fw_grad(/*level=*/0).defined(), kWho, ": forward-mode automatic "
                                "differentiation (torch.func.jvp, jacfwd, torch.autograd.forward_ad) of continuum::",
                                op, " is not implemented; use reverse mode (backward(), torch.autograd.grad, "
                                "torch.autograd.functional.jacobian)");
}

std::optional<Tensor> present(const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; }

/// continuum::backward's gradient: not implemented (a double backward raises).
struct BackwardFunction : torch::autograd::Function<BackwardFunction> {
  static variable_list forward(AutogradContext*, const Tensor& grad_out, const Tensor& query, const Tensor& key,
                               const Tensor& value, const Tensor& out, const Tensor& lse, const Tensor& row_stats,
                               const Tensor& row_ref, c10::string_view kernel, bool causal, int64_t window_left,
                               int64_t window_right, const std::optional<Tensor>& range_lo,
                               const std::optional<Tensor>& range_hi, const std::optional<Tensor>& temperature,
                               double temperature_value, std::optional<double> scale, c10::string_view compute) {
    const auto [dq, dk, dv, dt] = backward_below_autograd(grad_out, query, key, value, out, lse, row_stats, row_ref,
                                                          kernel, causal, window_left, window_right, range_lo,
                                                          range_hi, temperature, temperature_value, scale, compute);
    return {dq, dk, dv, dt};
  }
  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false, kWho, ": the gradient of the backward (double backward, create_graph=True then backward "
                             "again) is not implemented");
    return {};
  }
};

Four backward_autograd(const Tensor& grad_out, const Tensor& query, const Tensor& key, const Tensor& value,
                       const Tensor& out, const Tensor& lse, const Tensor& row_stats, const Tensor& row_ref,
                       c10::string_view kernel, bool causal, int64_t window_left, int64_t window_right,
                       const std::optional<Tensor>& range_lo, const std::optional<Tensor>& range_hi,
                       const std::optional<Tensor>& temperature, double temperature_value,
                       std::optional<double> scale, c10::string_view compute) {
  reject_forward_ad("backward", {grad_out, query, key, value, out, lse, row_stats, row_ref,
                                 temperature.value_or(Tensor())});
  if (!at::GradMode::is_enabled())  // (a backward pass, unless create_graph=True)
    return backward_below_autograd(grad_out, query, key, value, out, lse, row_stats, row_ref, kernel, causal,
                                   window_left, window_right, range_lo, range_hi, temperature, temperature_value,
                                   scale, compute);
  const variable_list r =
      BackwardFunction::apply(grad_out, query, key, value, out, lse, row_stats, row_ref, kernel, causal, window_left,
                              window_right, range_lo, range_hi, temperature, temperature_value, scale, compute);
  return {r[0], r[1], r[2], r[3]};
}

/// continuum::forward's gradient: continuum::backward with the forward's
/// options, its row statistics (the CPU forward's, when asked for) and, for a
/// tensor temperature, dτ. lse and the statistics have none.
struct ForwardFunction : torch::autograd::Function<ForwardFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& query, const Tensor& key, const Tensor& value,
                               c10::string_view kernel, bool causal, int64_t window_left, int64_t window_right,
                               const std::optional<Tensor>& range_lo, const std::optional<Tensor>& range_hi,
                               const std::optional<Tensor>& temperature, double temperature_value,
                               std::optional<double> scale, c10::string_view compute, bool row_stats) {
    const auto [out, lse, stats, ref] =
        forward_below_autograd(query, key, value, kernel, causal, window_left, window_right, range_lo, range_hi,
                               temperature, temperature_value, scale, compute, row_stats);
    ctx->save_for_backward({query, key, value, out, lse, stats, ref, range_lo.value_or(Tensor()),
                            range_hi.value_or(Tensor()), temperature.value_or(Tensor())});
    // The backward runs with the forward's compute (the same kernels, the same arithmetic).
    ctx->saved_data["kernel"] = std::string(kernel.data(), kernel.size());
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["window_left"] = window_left;
    ctx->saved_data["window_right"] = window_right;
    ctx->saved_data["temperature_value"] = temperature_value;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["compute"] = std::string(compute.data(), compute.size());
    // lse and the statistics have no gradient: forward_autograd detaches them
    // (mark_non_differentiable would be the same, but compiled autograd
    // asserts that a C++ function marks nothing), so only out's gradient
    // comes back, and nothing is filled with zeros for the others.
    ctx->set_materialize_grads(false);
    return {out, lse, stats, ref};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const Tensor& out = s[3];
    const Tensor grad_out = grads[0].defined() ? grads[0] : at::zeros_like(out);  // (grads not materialized)
    const std::string kernel = ctx->saved_data["kernel"].toStringRef();
    const std::string compute = ctx->saved_data["compute"].toStringRef();
    const c10::IValue& scale = ctx->saved_data["scale"];
    const Four r = backward_autograd(
        grad_out, s[0], s[1], s[2], out, s[4], s[5], s[6], kernel, ctx->saved_data["causal"].toBool(),
        ctx->saved_data["window_left"].toInt(), ctx->saved_data["window_right"].toInt(), present(s[7]),
        present(s[8]), present(s[9]), ctx->saved_data["temperature_value"].toDouble(),
        scale.isNone() ? std::nullopt : std::optional<double>(scale.toDouble()), compute);
    // One gradient per forward argument: query, key, value, then the options
    // (none), the temperature tensor's dτ.
    return {std::get<0>(r), std::get<1>(r), std::get<2>(r), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(),
            Tensor(), s[9].defined() ? std::get<3>(r) : Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

Four forward_autograd(const Tensor& query, const Tensor& key, const Tensor& value, c10::string_view kernel,
                      bool causal, int64_t window_left, int64_t window_right, const std::optional<Tensor>& range_lo,
                      const std::optional<Tensor>& range_hi, const std::optional<Tensor>& temperature,
                      double temperature_value, std::optional<double> scale, c10::string_view compute,
                      bool row_stats) {
  reject_forward_ad("forward", {query, key, value, temperature.value_or(Tensor())});
  // Without a gradient to record (torch.no_grad(), or no input that requires
  // one), the operator below autograd: the same outputs, none of them with a
  // gradient function.
  const auto wants = [](const Tensor& t) { return t.requires_grad(); };
  if (!at::GradMode::is_enabled() ||
      !(wants(query) || wants(key) || wants(value) || (temperature.has_value() && wants(*temperature))))
    return forward_below_autograd(query, key, value, kernel, causal, window_left, window_right, range_lo, range_hi,
                                  temperature, temperature_value, scale, compute, row_stats);
  const variable_list r = ForwardFunction::apply(query, key, value, kernel, causal, window_left, window_right,
                                                 range_lo, range_hi, temperature, temperature_value, scale, compute,
                                                 row_stats);
  return {r[0], r[1].detach(), r[2].detach(), r[3].detach()};
}

}  // namespace
}  // namespace continuum_torch

TORCH_LIBRARY(continuum, m) {
  m.def(
      "forward(Tensor query, Tensor key, Tensor value, str kernel, bool causal, "
      "int window_left, int window_right, Tensor? range_lo, Tensor? range_hi, "
      "Tensor? temperature, float temperature_value, float? scale, str compute=\"default\", "
      "bool row_stats=False) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor lse, "
      "Tensor row_stats, Tensor row_ref, str kernel, bool causal, int window_left, int window_right, Tensor? range_lo, "
      "Tensor? range_hi, Tensor? temperature, float temperature_value, float? scale, "
      "str compute=\"default\") -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(continuum, Autograd, m) {
  m.impl("forward", &continuum_torch::forward_autograd);
  m.impl("backward", &continuum_torch::backward_autograd);
}

TORCH_LIBRARY_IMPL(continuum, CPU, m) {
  m.impl("forward", &continuum_torch::forward_cpu);
  m.impl("backward", &continuum_torch::backward_cpu);
}

#if defined(CONTINUUM_ATTENTION_WITH_CUDA)
TORCH_LIBRARY_IMPL(continuum, CUDA, m) {
  m.impl("forward", &continuum_torch::forward_cuda);
  m.impl("backward", &continuum_torch::backward_cuda);
}
#endif

// _C.cpu_isa(): the instruction set whose CPU kernels the operator runs
// ("amx", "avx512bf16", "avx512", "avx2", "sse2": continuum::cpu_dispatch, chosen at the first call
// from the CPU or CONTINUUM_CPU_ISA; MATH.md §10, "Instruction sets"). ValueError
// when CONTINUUM_CPU_ISA names one this CPU cannot run.
static PyObject* cpu_isa(PyObject*, PyObject*) {
  try {
#if defined(CONTINUUM_CPU_DISPATCH)
    return PyUnicode_FromString(continuum::cpu_dispatch::name(continuum::cpu_dispatch::selected()));
#else
    return PyUnicode_FromString(continuum::cpu_detail::kCompiledIsa);
#endif
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
}

// `import continuum_attention._C` loads this library (and so runs the
// registrations above); the module has one function, cpu_isa(), and
// `with_cuda` (1 when the CUDA kernels were built in).
extern "C" PyObject* PyInit__C(void) {
  static PyMethodDef methods[] = {
      {"cpu_isa", cpu_isa, METH_NOARGS, "The instruction set of the CPU kernels the operator runs."},
      {nullptr, nullptr, 0, nullptr}};
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods,
                            nullptr, nullptr, nullptr, nullptr};
  PyObject* m = PyModule_Create(&def);
#if defined(CONTINUUM_ATTENTION_WITH_CUDA)
  const long with_cuda = 1;
#else
  const long with_cuda = 0;
#endif
  if (m != nullptr && PyModule_AddIntConstant(m, "with_cuda", with_cuda) != 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
